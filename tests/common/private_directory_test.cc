// Private directories (common/private_directory.h): made new and 0700, emptied and removed
// without following a link, whatever another user planted.
#include "common/private_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using cpprun::testing::readFile;
using cpprun::testing::TempDir;
namespace fs = std::filesystem;

// A directory that must come through untouched: a file and a subdirectory with a file.
std::string plantVictim(const std::string& path) {
  fs::create_directories(path + "/sub");
  std::ofstream(path + "/canary") << "canary\n";
  std::ofstream(path + "/sub/keep") << "keep\n";
  return path;
}

bool victimIntact(const std::string& path) {
  return readFile(path + "/canary") == "canary\n" && readFile(path + "/sub/keep") == "keep\n";
}

unsigned modeOf(const std::string& path) {
  return static_cast<unsigned>(fs::symlink_status(path).permissions()) & 07777;
}

}  // namespace

TEST_CASE("makeFreshDirectory makes a new 0700 directory named <prefix>XXXXXX, never reusing one",
          "[unit][security]") {
  TempDir dir;
  fs::create_directory(dir.path() + "/job_");  // a name without the random part is not taken
  auto a = cpprun::makeFreshDirectory(dir.path(), "job_");
  auto b = cpprun::makeFreshDirectory(dir.path(), "job_");
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  CHECK(a.value() != b.value());
  for (const std::string& made : {a.value(), b.value()}) {
    CHECK(fs::path(made).parent_path() == dir.path());
    CHECK(fs::path(made).filename().string().rfind("job_", 0) == 0);
    CHECK(fs::path(made).filename().string().size() == 10);
    CHECK(fs::is_directory(fs::symlink_status(made)));
    CHECK(modeOf(made) == 0700);
    CHECK(fs::is_empty(made));
  }
  // A '/' in the prefix (a run id is free text) stays in the one directory.
  auto slash = cpprun::makeFreshDirectory(dir.path(), "../x/y_");
  REQUIRE(slash.isOk());
  CHECK(fs::path(slash.value()).parent_path() == dir.path());
  CHECK(fs::path(slash.value()).filename().string().rfind(".._x_y_", 0) == 0);
  auto missing = cpprun::makeFreshDirectory(dir.path() + "/none", "a_");
  REQUIRE_FALSE(missing.isOk());
  CHECK_THAT(missing.status().message(),
             Catch::Contains("cannot create a directory " + dir.path() + "/none/a_XXXXXX"));
}

TEST_CASE("removeTree removes a link, never what it points to, at the top or inside the tree",
          "[unit][security]") {
  TempDir dir;
  const std::string victim = plantVictim(dir.path() + "/victim");
  // A link at the top.
  fs::create_directory_symlink(victim, dir.path() + "/link");
  REQUIRE(cpprun::removeTree(dir.path() + "/link").isOk());
  CHECK_FALSE(fs::exists(fs::symlink_status(dir.path() + "/link")));
  CHECK(victimIntact(victim));
  // Links inside (to a directory and to a file), a deep tree and plain files.
  const std::string tree = dir.path() + "/tree";
  fs::create_directories(tree + "/a/b/c");
  std::ofstream(tree + "/a/b/c/f") << "x";
  fs::create_directory_symlink(victim, tree + "/a/to_dir");
  fs::create_symlink(victim + "/canary", tree + "/a/b/to_file");
  REQUIRE(cpprun::removeTree(tree).isOk());
  CHECK_FALSE(fs::exists(fs::symlink_status(tree)));
  CHECK(victimIntact(victim));
  // Missing: fine.
  CHECK(cpprun::removeTree(dir.path() + "/never").isOk());
  CHECK_FALSE(cpprun::removeTree(dir.path() + "/..").isOk());
}

TEST_CASE("removeTree stops at its depth bound with an error naming the path", "[unit]") {
  TempDir dir;
  std::string deep = dir.path() + "/d";
  for (int i = 0; i <= cpprun::kMaxRemoveDepth + 1; ++i) deep += "/d";
  fs::create_directories(deep);
  const cpprun::Status s = cpprun::removeTree(dir.path() + "/d");
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("more than " + std::to_string(cpprun::kMaxRemoveDepth) +
                                          " directories deep"));
  CHECK_THAT(s.message(), Catch::StartsWith("cannot remove " + dir.path() + "/d/d/d/"));
}

TEST_CASE(
    "makeFreshSubdirectory replaces a planted link with a 0700 directory and leaves the "
    "link's target alone",
    "[unit][security]") {
  TempDir dir;
  const std::string victim = plantVictim(dir.path() + "/victim");
  const std::string run = dir.path() + "/run";
  fs::create_directory(run);
  fs::create_directory_symlink(victim, run + "/attempt_0");
  auto made = cpprun::makeFreshSubdirectory(run, "attempt_0");
  REQUIRE(made.isOk());
  CHECK(made.value() == run + "/attempt_0");
  CHECK(fs::is_directory(fs::symlink_status(made.value())));
  CHECK(modeOf(made.value()) == 0700);
  CHECK(fs::is_empty(made.value()));
  CHECK(victimIntact(victim));
  // An earlier attempt's directory (with a link inside) is emptied and made again.
  std::ofstream(made.value() + "/old") << "old";
  fs::create_directory_symlink(victim, made.value() + "/inner");
  auto again = cpprun::makeFreshSubdirectory(run, "attempt_0");
  REQUIRE(again.isOk());
  CHECK(fs::is_empty(again.value()));
  CHECK(victimIntact(victim));
  CHECK_FALSE(cpprun::makeFreshSubdirectory(run, "a/b").isOk());
  CHECK_FALSE(cpprun::makeFreshSubdirectory(run, "..").isOk());
}

TEST_CASE(
    "checkParentDirectory refuses a directory others may write without the sticky bit or "
    "another user owns, warns for a group-writable one",
    "[unit][security]") {
  TempDir dir;
  const std::string d = dir.path() + "/d";
  fs::create_directory(d);
  fs::permissions(d, fs::perms::owner_all);
  auto check = cpprun::checkParentDirectory(d, "--log-dir");
  CHECK(check.status.isOk());
  CHECK(check.warning.empty());
  fs::permissions(d, fs::perms::owner_all | fs::perms::group_all);  // 0770 (umask 002)
  check = cpprun::checkParentDirectory(d, "--log-dir");
  CHECK(check.status.isOk());
  CHECK_THAT(check.warning, Catch::StartsWith("--log-dir: its group may write " + d +
                                              " (mode 0770) and it has no sticky bit"));
  fs::permissions(d, fs::perms::all);  // 0777
  check = cpprun::checkParentDirectory(d, "--log-dir");
  CHECK(check.status.code() == cpprun::StatusCode::kInvalidArgument);
  CHECK_THAT(check.status.message(),
             Catch::StartsWith("--log-dir: anyone may write " + d + " (mode 0777)"));
  fs::permissions(d, fs::perms::all | fs::perms::sticky_bit);  // 1777, as /tmp
  check = cpprun::checkParentDirectory(d, "--log-dir");
  CHECK(check.status.isOk());
  CHECK(check.warning.empty());
  std::ofstream(dir.path() + "/file") << "x";
  CHECK_THAT(cpprun::checkParentDirectory(dir.path() + "/file", "--log-dir").status.message(),
             Catch::Contains("is not a directory"));
  if (::geteuid() == 0) {
    fs::permissions(d, fs::perms::owner_all);
    REQUIRE(::chown(d.c_str(), 54321, 54321) == 0);
    check = cpprun::checkParentDirectory(d, "--log-dir");
    CHECK_THAT(check.status.message(),
               Catch::StartsWith("--log-dir: " + d + " belongs to another user (uid 54321)"));
  } else {
    // Owned by root, not this user: allowed (root could do anything anyway).
    CHECK(cpprun::checkParentDirectory("/", "--log-dir").status.isOk());
  }
}
