#include "examples/mnist/checkpoint.h"

#include <dirent.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>

#include "tests/support/test_support.h"

using namespace cpprun::mnist;
using cpprun::testing::TempDir;

namespace {

Checkpoint sample() {
  Checkpoint c;
  c.model = "cnn";
  c.optimizer = "adamw";
  c.epochs_done = 3;
  c.optimizer_steps = 375;
  c.seed = 42;
  c.world_size = 2;
  c.parameters = {1.0f, -2.5f, 3.25f, 0.0f};
  c.optimizer_buffers = {{0.1f, 0.2f, 0.3f, 0.4f}, {1.0f, 1.0f, 2.0f, 3.0f}};
  return c;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

}  // namespace

TEST_CASE("checkpoint: saved and loaded bit for bit, leaving no temporary file",
          "[unit][mnist][checkpoint]") {
  TempDir dir;
  const std::string path = latestCheckpointPath(dir.path());
  REQUIRE(saveCheckpoint(path, sample()).isOk());
  // Overwriting goes through a temporary file and a rename as well.
  Checkpoint second = sample();
  second.epochs_done = 4;
  REQUIRE(saveCheckpoint(path, second).isOk());
  CHECK(filesIn(dir.path()) == std::vector<std::string>{"latest.ckpt"});
  auto loaded = loadCheckpoint(path);
  REQUIRE(loaded.isOk());
  const Checkpoint& c = loaded.value();
  CHECK(c.model == "cnn");
  CHECK(c.optimizer == "adamw");
  CHECK(c.epochs_done == 4);
  CHECK(c.optimizer_steps == 375);
  CHECK(c.seed == 42u);
  CHECK(c.world_size == 2);
  CHECK(c.parameters == sample().parameters);
  CHECK(c.optimizer_buffers == sample().optimizer_buffers);
}

TEST_CASE("checkpoint: a flipped bit, a truncation, another file and a missing file are named",
          "[unit][mnist][checkpoint]") {
  TempDir dir;
  const std::string path = dir.path() + "/c.ckpt";
  REQUIRE(saveCheckpoint(path, sample()).isOk());
  const std::string good = readAll(path);

  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 0x04;
  writeAll(path, flipped);
  auto bad = loadCheckpoint(path);
  REQUIRE_FALSE(bad.isOk());
  CHECK_THAT(bad.status().message(), Catch::Contains(path) && Catch::Contains("CRC-32 mismatch"));

  writeAll(path, good.substr(0, good.size() / 2));
  bad = loadCheckpoint(path);
  REQUIRE_FALSE(bad.isOk());
  CHECK_THAT(bad.status().message(), Catch::Contains("corrupt"));

  writeAll(path, "PK\x03\x04 not a checkpoint at all");
  bad = loadCheckpoint(path);
  REQUIRE_FALSE(bad.isOk());
  CHECK_THAT(bad.status().message(), Catch::Contains("bad magic"));

  bad = loadCheckpoint(dir.path() + "/absent.ckpt");
  REQUIRE_FALSE(bad.isOk());
  CHECK_THAT(bad.status().message(),
             Catch::Contains("absent.ckpt") && Catch::Contains("cannot open"));
}

TEST_CASE("checkpoint: saving into a missing directory is an error, not a crash",
          "[unit][mnist][checkpoint]") {
  TempDir dir;
  cpprun::Status s = saveCheckpoint(dir.path() + "/no/such/dir/latest.ckpt", sample());
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("no/such/dir"));
}
