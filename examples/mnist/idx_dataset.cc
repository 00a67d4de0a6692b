#include "examples/mnist/idx_dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace cpprun::mnist {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
// Far above any real dataset (ImageNet-sized MNIST lookalikes included): refuse absurd headers
// before allocating.
constexpr uint64_t kMaxBytes = uint64_t{1} << 34;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The whole file, decompressed when it is gzip (zlib reads plain files as they are).
Result<std::vector<uint8_t>> readAll(const std::string& path) {
  if (!exists(path)) return Status(StatusCode::kNotFound, path + ": no such file");
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return invalidArgument(path + ": cannot open: " + std::strerror(errno));
  }
  std::vector<uint8_t> data;
  uint8_t buf[1 << 16];
  while (true) {
    const int n = ::gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      std::string what = ::gzerror(f, &err);
      ::gzclose(f);
      return invalidArgument(path + ": corrupt or truncated gzip data (" + what + ")");
    }
    if (n == 0) break;
    data.insert(data.end(), buf, buf + n);
    if (data.size() > kMaxBytes) {
      ::gzclose(f);
      return invalidArgument(path + ": larger than any MNIST-format file should be");
    }
  }
  ::gzclose(f);
  return data;
}

uint32_t bigEndian32(const std::vector<uint8_t>& d, size_t at) {
  return (uint32_t{d[at]} << 24) | (uint32_t{d[at + 1]} << 16) | (uint32_t{d[at + 2]} << 8) |
         uint32_t{d[at + 3]};
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The file is long enough for its header and starts with the right magic number.
Status checkHeader(const std::string& path, const std::vector<uint8_t>& data, size_t header_bytes,
                   uint32_t magic, const char* kind) {
  if (data.size() < header_bytes) {
    return invalidArgument(path + ": " + std::to_string(data.size()) +
                           " bytes is shorter than an IDX " + kind + " header (" +
                           std::to_string(header_bytes) + ")");
  }
  if (bigEndian32(data, 0) != magic) {
    return invalidArgument(path + ": magic " + hex(bigEndian32(data, 0)) + " is not an IDX " +
                           kind + " file's (" + hex(magic) + ")");
  }
  return Status::ok();
}

}  // namespace

Result<IdxDataset> loadIdxDataset(const std::string& images_path, const std::string& labels_path) {
  auto images = readAll(images_path);
  if (!images.isOk()) return images.status();
  auto labels = readAll(labels_path);
  if (!labels.isOk()) return labels.status();
  const std::vector<uint8_t>& im = images.value();
  const std::vector<uint8_t>& lb = labels.value();

  if (Status s = checkHeader(images_path, im, 16, kImagesMagic, "image"); !s.isOk()) return s;
  if (Status s = checkHeader(labels_path, lb, 8, kLabelsMagic, "label"); !s.isOk()) return s;
  const uint64_t count = bigEndian32(im, 4);
  const uint64_t rows = bigEndian32(im, 8);
  const uint64_t cols = bigEndian32(im, 12);
  const uint64_t label_count = bigEndian32(lb, 4);
  if (count == 0 || rows == 0 || cols == 0 || count > INT32_MAX || rows > 4096 || cols > 4096) {
    return invalidArgument(images_path + ": implausible header (" + std::to_string(count) +
                           " images of " + std::to_string(rows) + "x" + std::to_string(cols) + ")");
  }
  if (label_count != count) {
    return invalidArgument(labels_path + ": " + std::to_string(label_count) + " labels for " +
                           std::to_string(count) + " images in " + images_path);
  }
  const uint64_t want_images = 16 + count * rows * cols;
  if (im.size() != want_images) {
    return invalidArgument(images_path + ": " + std::to_string(im.size()) + " bytes, expected " +
                           std::to_string(want_images) + " for " + std::to_string(count) +
                           " images of " + std::to_string(rows) + "x" + std::to_string(cols) +
                           (im.size() < want_images ? " (truncated)" : " (trailing bytes)"));
  }
  if (lb.size() != 8 + count) {
    return invalidArgument(labels_path + ": " + std::to_string(lb.size()) + " bytes, expected " +
                           std::to_string(8 + count) + " for " + std::to_string(count) + " labels" +
                           (lb.size() < 8 + count ? " (truncated)" : " (trailing bytes)"));
  }
  IdxDataset d;
  d.count = static_cast<int>(count);
  d.rows = static_cast<int>(rows);
  d.cols = static_cast<int>(cols);
  d.source = images_path;
  d.pixels.assign(im.begin() + 16, im.end());
  d.labels.assign(lb.begin() + 8, lb.end());
  for (size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] > 9) {
      return invalidArgument(labels_path + ": label " + std::to_string(d.labels[i]) + " of item " +
                             std::to_string(i) + " is not a class 0-9");
    }
  }
  return d;
}

Result<IdxDataset> loadMnistSplit(const std::string& dir, const std::string& split) {
  auto pick = [&](const std::string& stem) {
    const std::string raw = dir + "/" + split + "-" + stem;
    return exists(raw) ? raw : raw + ".gz";
  };
  const std::string images = pick("images-idx3-ubyte");
  const std::string labels = pick("labels-idx1-ubyte");
  if (!exists(images)) {
    return Status(StatusCode::kNotFound, "--data " + dir + ": no " + split +
                                             "-images-idx3-ubyte[.gz] (MNIST's file names)");
  }
  if (!exists(labels)) {
    return Status(StatusCode::kNotFound, "--data " + dir + ": no " + split +
                                             "-labels-idx1-ubyte[.gz] (MNIST's file names)");
  }
  return loadIdxDataset(images, labels);
}

}  // namespace cpprun::mnist
