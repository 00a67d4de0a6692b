// OutputWriter and OutputSinks: writes leave the caller at once whatever the reader does, in
// order, accounted; a reader who never reads again costs a bounded wait at stop.
#include "agent/console/output_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "agent/console/worker_output.h"

namespace {

using namespace cpprun::agent;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Pipe {
  Pipe() { REQUIRE(::pipe2(fds, O_CLOEXEC) == 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  std::string readAll(std::chrono::milliseconds quiet = 200ms) {
    std::string out;
    char buf[65536];
    for (;;) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(quiet.count())) <= 0) return out;
      ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  int fds[2] = {-1, -1};
};

}  // namespace

TEST_CASE("the writer writes chunks whole and in order and accounts for them", "[unit]") {
  Pipe pipe;
  auto queued = std::make_shared<std::atomic<size_t>>(0);
  OutputWriter writer;
  std::string expected;
  for (int i = 0; i < 100; ++i) {
    std::string line = "line " + std::to_string(i) + "\n";
    expected += line;
    writer.write(pipe.fds[1], line, queued);
  }
  REQUIRE(writer.flush(5s));
  CHECK(queued->load() == 0);
  CHECK(writer.queuedBytes() == 0);
  CHECK(pipe.readAll() == expected);
}

TEST_CASE("a reader who stops reading never blocks the caller, and costs a bounded stop",
          "[unit]") {
  Pipe pipe;  // nobody reads: 64 KiB fit, then write(2) blocks on the writer's thread
  auto queued = std::make_shared<std::atomic<size_t>>(0);
  auto writer = std::make_unique<OutputWriter>();
  const std::string chunk(64 * 1024, 'x');
  const auto start = Clock::now();
  for (int i = 0; i < 64; ++i) writer->write(pipe.fds[1], chunk, queued);  // 4 MiB
  CHECK(Clock::now() - start < 1s);                                        // queued, not written
  CHECK(queued->load() >= 62 * chunk.size());
  CHECK_FALSE(writer->flush(100ms));
  const auto stopping = Clock::now();
  CHECK_FALSE(writer->stop(300ms));  // gives the rest up
  CHECK(Clock::now() - stopping < 2s);
  CHECK(queued->load() <= chunk.size());          // at most the chunk still inside write(2)
  writer->write(pipe.fds[1], "dropped", queued);  // stopped: dropped, not queued
  CHECK(queued->load() <= chunk.size());
  // The thread blocked in write(2) is detached; reading lets it finish.
  (void)pipe.readAll(50ms);
  writer.reset();
}

TEST_CASE("closeAfterWrites closes once what was queued before is written", "[unit]") {
  Pipe pipe;
  OutputWriter writer;
  const int fd = ::dup(pipe.fds[1]);
  REQUIRE(fd >= 0);
  ::close(pipe.fds[1]);
  pipe.fds[1] = -1;
  writer.write(fd, "last words\n");
  writer.closeAfterWrites(fd);
  REQUIRE(writer.flush(5s));
  // Every write end is closed now: the reader sees the bytes, then EOF.
  std::string got;
  char buf[64];
  ssize_t n;
  while ((n = ::read(pipe.fds[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  CHECK(got == "last words\n");
  CHECK(n == 0);
}

TEST_CASE("agent log lines over their budget are dropped and counted", "[unit]") {
  Pipe out;
  Pipe err;  // nobody reads
  OutputSinks sinks(out.fds[1], err.fds[1]);
  const std::string line(4096, 'l');
  for (int i = 0; i < 1000; ++i) sinks.writeLog(line + "\n");  // 4 MiB against a 1 MiB budget
  CHECK(sinks.dropped_log_lines.load() > 0);
  CHECK(sinks.console(err.fds[1]).queuedBytes() <= kLogBytesWaiting + 2 * line.size());
  CHECK_FALSE(sinks.stop(200ms, 200ms));
  (void)err.readAll(100ms);  // lets the detached writer finish its chunk
}

TEST_CASE("the failure report reaches a console whose budget is spent", "[unit]") {
  Pipe out;
  Pipe err;  // read only once everything is queued
  OutputSinks sinks(out.fds[1], err.fds[1]);
  const std::string line(4096, 'l');
  for (int i = 0; i < 1000; ++i) sinks.writeLog(line + "\n");  // 4 MiB against a 1 MiB budget
  REQUIRE(sinks.dropped_log_lines.load() > 0);
  const uint64_t dropped = sinks.dropped_log_lines.load();
  const std::string report =
      "=====\ntrain.py FAILED\nRoot Cause (first observed failure):\n=====\n";
  sinks.writeReport(report);
  CHECK(sinks.dropped_log_lines.load() == dropped);
  std::string got;
  const auto deadline = Clock::now() + 10s;
  while (got.find("=====\n", got.size() < report.size() ? 0 : got.size() - report.size()) ==
             std::string::npos &&
         Clock::now() < deadline) {
    got += err.readAll(100ms);
  }
  REQUIRE(got.size() >= report.size());
  CHECK(got.substr(got.size() - report.size()) == report);  // last, whole
  CHECK(sinks.stop(5s, 5s));
}

TEST_CASE("a writer that has taken nothing while bytes wait reports how long it stalled",
          "[unit]") {
  Pipe pipe;
  auto writer = std::make_unique<OutputWriter>();
  CHECK(writer->stalledFor() == 0ms);                        // nothing to write: never stalled
  writer->write(pipe.fds[1], std::string(128 * 1024, 's'));  // twice what the pipe holds
  const auto deadline = Clock::now() + 5s;
  while (writer->stalledFor() < 100ms && Clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  CHECK(writer->stalledFor() >= 100ms);
  // The reader comes back: the chunk completes and the stall is over.
  std::string got;
  while (got.size() < 128 * 1024) got += pipe.readAll(100ms);
  REQUIRE(writer->flush(5s));
  CHECK(writer->stalledFor() == 0ms);
  writer.reset();
}
