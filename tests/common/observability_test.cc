// The small pure pieces behind cpprun's visible waiting and progress reports: WaitNotice's
// schedule, formatWait, and the progress file's writer and reader.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/progress_file.h"
#include "common/wait_notice.h"

namespace {

using cpprun::WaitNotice;
using namespace std::chrono_literals;

struct TempFile {
  std::string path;
  TempFile() {
    char templ[] = "/tmp/cpprun-progress-XXXXXX";
    const int fd = ::mkstemp(templ);
    REQUIRE(fd >= 0);
    ::close(fd);
    ::unlink(templ);  // the reporter creates it
    path = templ;
  }
  ~TempFile() { ::unlink(path.c_str()); }
};

}  // namespace

TEST_CASE("WaitNotice: at 5 s, every 5 s for a minute, then every 30 s", "[unit]") {
  const auto t0 = WaitNotice::Clock::time_point{} + 1000s;
  WaitNotice notice(t0);
  CHECK_FALSE(notice.due(t0));
  CHECK_FALSE(notice.due(t0 + 4999ms));
  CHECK(notice.due(t0 + 5s));
  CHECK_FALSE(notice.due(t0 + 5s));  // once per slot
  CHECK_FALSE(notice.due(t0 + 9s));
  CHECK(notice.due(t0 + 10s));
  int in_first_minute = 2;
  for (auto t = t0 + 11s; t < t0 + 60s; t += 1s) in_first_minute += notice.due(t) ? 1 : 0;
  CHECK(in_first_minute == 11);  // 5, 10, ..., 55
  int in_ten_minutes = 0;
  for (auto t = t0 + 60s; t < t0 + 600s; t += 1s) in_ten_minutes += notice.due(t) ? 1 : 0;
  CHECK(in_ten_minutes == 18);  // 60, 90, ..., 570: bounded volume over a long wait
  // A late wake-up (a long blocking call) gives one notice, not a burst.
  WaitNotice late(t0);
  CHECK(late.due(t0 + 40s));
  CHECK_FALSE(late.due(t0 + 41s));
  CHECK(late.next() == t0 + 45s);
}

TEST_CASE("formatWait: tenths below 10 s, then s, min, h", "[unit]") {
  CHECK(cpprun::formatWait(0ms) == "0.0 s");
  CHECK(cpprun::formatWait(-5ms) == "0.0 s");
  CHECK(cpprun::formatWait(1499ms) == "1.5 s");
  CHECK(cpprun::formatWait(12345ms) == "12 s");
  CHECK(cpprun::formatWait(183s) == "3 min 3 s");
  CHECK(cpprun::formatWait(7500s) == "2 h 5 min");
}

TEST_CASE("progress file: what the reporter writes the reader reads, and every bump moves it",
          "[unit]") {
  TempFile file;
  CHECK_FALSE(cpprun::readProgress(file.path).has_value());  // not reported yet
  cpprun::ProgressReporter reporter(file.path);
  REQUIRE(reporter.active());
  reporter.bump(123456789012ULL);
  auto first = cpprun::readProgress(file.path);
  REQUIRE(first.has_value());
  CHECK(first->counter == 123456789012ULL);
  // A smaller counter leaves no digits of the larger one behind (fixed width, in place).
  reporter.bump(7);
  auto second = cpprun::readProgress(file.path);
  REQUIRE(second.has_value());
  CHECK(second->counter == 7u);
  struct stat st {};
  REQUIRE(::stat(file.path.c_str(), &st) == 0);
  CHECK(st.st_size == 21);
  // A `touch` (no counter) is progress too: the modification time is what the agent watches.
  std::ofstream(file.path, std::ios::trunc) << "";
  auto touched = cpprun::readProgress(file.path);
  REQUIRE(touched.has_value());
  CHECK_FALSE(touched->counter.has_value());
  CHECK(touched->mtime_ns >= second->mtime_ns);
}

TEST_CASE("progress reporter: without CPPRUN_PROGRESS_FILE it does nothing", "[unit]") {
  ::unsetenv(cpprun::kProgressFileVariable);
  auto reporter = cpprun::ProgressReporter::fromEnvironment();
  CHECK_FALSE(reporter.active());
  reporter.bump(1);  // no effect, no crash
  cpprun::ProgressReporter unwritable("/nonexistent-dir/progress");
  CHECK_FALSE(unwritable.active());
  unwritable.bump(1);
}
