// The collective record's writer (common/collective_record.h): what a C++ trainer's recorder puts
// in the file, read back by the agent's parser, and a recorder with no file costing nothing.
#include "common/collective_record.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tests/support/test_support.h"

namespace {

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("collective record: a recorder numbers its group's collectives, in then after",
          "[unit]") {
  cpprun::testing::TempDir dir;
  const std::string path = dir.path() + "/collective";
  cpprun::CollectiveRecorder recorder(path, "world");
  { auto first = recorder.enter("broadcast"); }
  {
    auto second = recorder.enter("all_reduce");
    const std::string inside = contents(path);
    CHECK(inside.size() == cpprun::kCollectiveRecordBytes);
    auto record = cpprun::parseCollectiveRecord(inside);
    REQUIRE(record.isOk());
    CHECK(record.value().inside);
    CHECK(record.value().op == "all_reduce");
    CHECK(record.value().seq == 2);
  }
  auto done = cpprun::parseCollectiveRecord(contents(path));
  REQUIRE(done.isOk());
  CHECK_FALSE(done.value().inside);
  CHECK(done.value().seq == 2);
  CHECK(recorder.count() == 2);
  // Moved, it goes on numbering in the same file.
  cpprun::CollectiveRecorder moved = std::move(recorder);
  { auto third = moved.enter("barrier"); }
  CHECK(cpprun::parseCollectiveRecord(contents(path)).value().seq == 3);
}

TEST_CASE("collective record: without a file the recorder does nothing", "[unit]") {
  cpprun::CollectiveRecorder none("", "world");
  { auto scope = none.enter("all_reduce"); }
  CHECK(none.count() == 1);
  cpprun::CollectiveRecorder unwritable("/nonexistent-dir/x", "world");
  { auto scope = unwritable.enter("all_reduce"); }
  CHECK(unwritable.count() == 1);
}

TEST_CASE("collective record: a collective that throws leaves the rank recorded in it", "[unit]") {
  cpprun::testing::TempDir dir;
  const std::string path = dir.path() + "/collective";
  cpprun::CollectiveRecorder recorder(path, "world");
  try {
    auto scope = recorder.enter("all_reduce");
    throw std::runtime_error("Connection closed by peer");
  } catch (const std::runtime_error&) {
  }
  auto record = cpprun::parseCollectiveRecord(contents(path));
  REQUIRE(record.isOk());
  CHECK(record.value().inside);  // where it waited when its peer was torn down
  CHECK(record.value().seq == 1);
}
