#include "examples/mnist/idx_dataset.h"

#include <zlib.h>

#include <array>
#include <catch2/catch.hpp>
#include <fstream>

#include "tests/support/test_support.h"

using cpprun::mnist::IdxDataset;
using cpprun::mnist::loadIdxDataset;
using cpprun::mnist::loadMnistSplit;
using cpprun::testing::sourcePath;
using cpprun::testing::TempDir;
using Bytes = std::vector<uint8_t>;

namespace {

void put32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(v >> shift));
}

Bytes imagesFile(uint32_t magic, uint32_t count, uint32_t rows, uint32_t cols, size_t pixels) {
  Bytes b;
  put32(b, magic);
  put32(b, count);
  put32(b, rows);
  put32(b, cols);
  for (size_t i = 0; i < pixels; ++i) b.push_back(static_cast<uint8_t>(i));
  return b;
}

Bytes labelsFile(uint32_t magic, uint32_t count, Bytes labels) {
  Bytes b;
  put32(b, magic);
  put32(b, count);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

std::string write(const std::string& path, const Bytes& b, bool gzip = false) {
  if (gzip) {
    gzFile f = ::gzopen(path.c_str(), "wb");
    ::gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
    ::gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  return path;
}

std::string errorOf(const std::string& images, const std::string& labels) {
  auto r = loadIdxDataset(images, labels);
  REQUIRE_FALSE(r.isOk());
  return r.status().message();
}

}  // namespace

TEST_CASE("the shipped digits load: 7996 + 2004 real 28x28 MNIST digits of every class",
          "[unit][mnist]") {
  const std::string dir = sourcePath("examples/mnist/data");
  auto train = loadMnistSplit(dir, "train");
  auto test = loadMnistSplit(dir, "t10k");
  INFO(train.status().message() << test.status().message());
  REQUIRE(train.isOk());
  REQUIRE(test.isOk());
  CHECK(train.value().count == 7996);
  CHECK(test.value().count == 2004);
  for (const IdxDataset* d : {&train.value(), &test.value()}) {
    CHECK(d->rows == 28);
    CHECK(d->cols == 28);
    CHECK(d->pixels.size() == static_cast<size_t>(d->count) * 784);
    std::array<int, 10> per_class{};
    for (uint8_t l : d->labels) ++per_class[l];
    for (int c = 0; c < 10; ++c) CHECK(per_class[static_cast<size_t>(c)] > d->count / 20);
  }
  // A digit is ink on a dark background: most pixels 0, some near 255.
  const auto& px = train.value().pixels;
  CHECK(std::count(px.begin(), px.end(), 0) > static_cast<long>(px.size() / 2));
  CHECK(*std::max_element(px.begin(), px.end()) >= 250);
}

TEST_CASE("raw and gzip files load the same", "[unit][mnist]") {
  TempDir dir;
  const Bytes im = imagesFile(0x803, 3, 2, 2, 12);
  const Bytes lb = labelsFile(0x801, 3, {7, 0, 9});
  auto raw = loadIdxDataset(write(dir.path() + "/i", im), write(dir.path() + "/l", lb));
  auto gz =
      loadIdxDataset(write(dir.path() + "/i.gz", im, true), write(dir.path() + "/l.gz", lb, true));
  REQUIRE(raw.isOk());
  REQUIRE(gz.isOk());
  CHECK(raw.value().pixels == gz.value().pixels);
  CHECK(raw.value().labels == Bytes{7, 0, 9});
  CHECK(gz.value().labels == Bytes{7, 0, 9});
  CHECK(raw.value().pixels[11] == 11);
}

TEST_CASE("corrupt and missing files are named with what is wrong", "[unit][mnist]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string good_labels = write(d + "/l", labelsFile(0x801, 3, {1, 2, 3}));
  const std::string good_images = write(d + "/i", imagesFile(0x803, 3, 2, 2, 12));
  CHECK_THAT(errorOf(d + "/none", good_labels), Catch::Contains(d + "/none: no such file"));
  CHECK_THAT(errorOf(write(d + "/m", imagesFile(0x801, 3, 2, 2, 12)), good_labels),
             Catch::Contains(d + "/m: magic 0x00000801 is not an IDX image file's"));
  CHECK_THAT(errorOf(good_images, write(d + "/lm", labelsFile(0x803, 3, {1, 2, 3}))),
             Catch::Contains("/lm: magic 0x00000803"));
  CHECK_THAT(errorOf(write(d + "/t", imagesFile(0x803, 3, 2, 2, 11)), good_labels),
             Catch::Contains("/t: 27 bytes, expected 28") && Catch::Contains("(truncated)"));
  CHECK_THAT(errorOf(write(d + "/x", imagesFile(0x803, 3, 2, 2, 13)), good_labels),
             Catch::Contains("(trailing bytes)"));
  CHECK_THAT(errorOf(good_images, write(d + "/lc", labelsFile(0x801, 2, {1, 2}))),
             Catch::Contains("/lc: 2 labels for 3 images"));
  CHECK_THAT(errorOf(good_images, write(d + "/lv", labelsFile(0x801, 3, {1, 12, 3}))),
             Catch::Contains("/lv: label 12 of item 1 is not a class 0-9"));
  CHECK_THAT(errorOf(write(d + "/s", Bytes{0, 0, 8}), good_labels),
             Catch::Contains("shorter than an IDX image header"));
  CHECK_THAT(errorOf(write(d + "/h", imagesFile(0x803, 0, 28, 28, 0)), good_labels),
             Catch::Contains("implausible header"));
  // A gzip file cut short.
  Bytes gz_images;
  {
    write(d + "/full.gz", imagesFile(0x803, 3, 2, 2, 12), true);
    std::ifstream in(d + "/full.gz", std::ios::binary);
    gz_images.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    gz_images.resize(gz_images.size() / 2);
  }
  CHECK_THAT(errorOf(write(d + "/cut.gz", gz_images), good_labels), Catch::Contains("/cut.gz"));
  auto missing_split = loadMnistSplit(d, "train");
  REQUIRE_FALSE(missing_split.isOk());
  CHECK_THAT(missing_split.status().message(),
             Catch::Contains("--data " + d + ": no train-images-idx3-ubyte[.gz]"));
}
