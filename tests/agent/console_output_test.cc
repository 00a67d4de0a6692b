// The console's line policy (docs/supervision.md, "Console"): carriage returns in the splitter,
// progress updates at most once per interval, open lines on a terminal console that continue in
// place and are ended by anyone else's output.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "agent/console/worker_output.h"
#include "common/asio.h"

namespace {

using namespace cpprun::agent;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Collected {
  std::vector<std::string> lines;
  std::vector<std::string> updates;
  std::function<void(std::string_view)> line() {
    return [this](std::string_view l) { lines.emplace_back(l); };
  }
  std::function<void(std::string_view)> update() {
    return [this](std::string_view u) { updates.emplace_back(u); };
  }
};

TEST_CASE("LineSplitter: a line is what follows its last carriage return", "[unit]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("\r 10%\r 20%\r100%\n", c.line(), c.update());
  CHECK(c.lines == std::vector<std::string>{"100%"});
  CHECK(c.updates == std::vector<std::string>{" 10%", " 20%"});
  CHECK(splitter.pending().empty());
  CHECK_FALSE(splitter.pendingIsUpdate());
}

TEST_CASE("LineSplitter: CR LF ends a line, also split across reads", "[unit]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("abc\r", c.line(), c.update());
  CHECK(c.lines.empty());
  splitter.feed("\ndef\r\n", c.line(), c.update());
  CHECK(c.lines == std::vector<std::string>{"abc", "def"});
  CHECK(c.updates.empty());
}

TEST_CASE("LineSplitter: a line ended right after its last CR shows its last update", "[unit]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("50%\r100%\r\r\n", c.line(), c.update());
  CHECK(c.lines == std::vector<std::string>{"100%"});
  splitter.feed("1%\r2%\r", c.line(), c.update());
  CHECK(splitter.pendingIsUpdate());
  splitter.finish(c.line());  // the stream ends on an update: its last state is the last line
  CHECK(c.lines == std::vector<std::string>{"100%", "2%"});
}

TEST_CASE("LineSplitter: the unfinished line and whether it is an update", "[unit]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("(Pdb) ", c.line(), c.update());
  CHECK(splitter.pending() == "(Pdb) ");
  CHECK_FALSE(splitter.pendingIsUpdate());
  splitter.feed("p 1\n\rstep 3", c.line(), c.update());
  CHECK(c.lines == std::vector<std::string>{"(Pdb) p 1"});
  CHECK(splitter.pending() == "step 3");
  CHECK(splitter.pendingIsUpdate());
}

TEST_CASE("LineSplitter: the line limit holds with carriage returns", "[unit]") {
  LineSplitter splitter(8);
  Collected c;
  splitter.feed("\r0123456789ab\n", c.line(), c.update());
  CHECK(c.lines == std::vector<std::string>{"01234567", "89ab"});
}

// A worker stream read by a WorkerOutput, its console a pipe this test reads.
struct StreamRig {
  explicit StreamRig(bool terminal) {
    REQUIRE(::pipe2(worker, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
    sinks = std::make_shared<OutputSinks>(console[1], console[1]);
    sinks->attachLoop(&io);
    StreamRoute route;
    route.console_fd = console[1];
    route.prefix = "[p]";
    route.terminal = terminal;
    auto made = WorkerOutput::create(
        io, worker[0], route, 5, [] {}, sinks);
    REQUIRE(made.isOk());
    out = std::move(made).value();
    out->start();
  }
  ~StreamRig() {
    out.reset();
    sinks->attachLoop(nullptr);
    sinks->stop(1s, 1s);
    ::close(worker[1]);
    ::close(console[0]);
    ::close(console[1]);
  }
  void write(const std::string& bytes) {
    REQUIRE(::write(worker[1], bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
  // Runs the loop until the console has shown `text` (bounded).
  bool shows(const std::string& text, std::chrono::milliseconds bound = 5s) {
    const auto deadline = Clock::now() + bound;
    while (shown.find(text) == std::string::npos && Clock::now() < deadline) {
      io.run_for(10ms);
      io.restart();
      char buffer[4096];
      pollfd p{console[0], POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) {
        const ssize_t n = ::read(console[0], buffer, sizeof buffer);
        if (n > 0) shown.append(buffer, static_cast<size_t>(n));
      }
    }
    return shown.find(text) != std::string::npos;
  }

  boost::asio::io_context io;
  int worker[2] = {-1, -1};
  int console[2] = {-1, -1};
  std::shared_ptr<OutputSinks> sinks;
  std::unique_ptr<WorkerOutput> out;
  std::string shown;
};

TEST_CASE("WorkerOutput: the tail keeps a runaway line as one line, its head and its length",
          "[unit]") {
  StreamRig rig(false);
  const std::string runaway(200 * 1000, 'y');  // cut into 64 KiB pieces on the console
  // More than the pipe holds: written by a thread while the loop reads.
  const std::string bytes = "short\n" + runaway + "\nafter\n";
  std::thread writer([&] {
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::write(rig.worker[1], bytes.data() + done, bytes.size() - done);
      if (n <= 0) return;  // the check below fails
      done += static_cast<size_t>(n);
    }
  });
  const bool shown_all = rig.shows("[p]after\n");
  writer.join();
  REQUIRE(shown_all);
  CHECK(rig.out->tail() ==
        std::vector<std::string>{"short",
                                 std::string(kTailLineBytes, 'y') + "\xE2\x80\xA6 (" +
                                     std::to_string(runaway.size() - kTailLineBytes) +
                                     " bytes clipped)",
                                 "after"});
  // The console has every byte of it.
  size_t shown = 0;
  for (size_t pos = rig.shown.find("[p]y"); pos != std::string::npos;
       pos = rig.shown.find("[p]y", pos + 1)) {
    shown += rig.shown.find('\n', pos) - pos - 3;
  }
  CHECK(shown == runaway.size());
}

TEST_CASE("WorkerOutput: progress updates reach a plain console as lines, throttled", "[unit]") {
  StreamRig rig(/*terminal=*/false);
  rig.write("\r 1%\r 2%\r 3%");
  REQUIRE(rig.shows("[p] 3%\n"));  // the first update at once, as the latest state
  rig.write("\r 4%\r 5%");         // within the interval: held back ...
  rig.write("\r100%\n");
  REQUIRE(rig.shows("[p]100%\n"));  // ... and superseded by the line's end
  CHECK(rig.shown == "[p] 3%\n[p]100%\n");
  CHECK(rig.out->tail() == std::vector<std::string>{"100%"});  // final states only
}

TEST_CASE("WorkerOutput: a line that ends in the update shown last is not shown twice", "[unit]") {
  StreamRig rig(/*terminal=*/false);
  rig.write("\r 1%\r100%");
  REQUIRE(rig.shows("[p]100%\n"));
  rig.write("\nnext\n");
  REQUIRE(rig.shows("[p]next\n"));
  CHECK(rig.shown == "[p]100%\n[p]next\n");
  CHECK(rig.out->tail() == std::vector<std::string>{"100%", "next"});  // the tail keeps it
}

TEST_CASE("WorkerOutput: a held-back update shows within the interval", "[unit]") {
  StreamRig rig(/*terminal=*/false);
  rig.write("\r 1%");
  REQUIRE(rig.shows("[p] 1%\n"));
  rig.write("\r 2%");
  REQUIRE(rig.shows("[p] 2%\n", kProgressUpdateInterval + 3s));
}

TEST_CASE("WorkerOutput: on a terminal a prompt shows at once and its line continues in place",
          "[unit]") {
  StreamRig rig(/*terminal=*/true);
  rig.write("(Pdb) ");
  REQUIRE(rig.shows("[p](Pdb) "));
  rig.write("p 6");
  REQUIRE(rig.shows("[p](Pdb) p 6"));
  rig.write("*7\n42\n");
  REQUIRE(rig.shows("42\n"));
  CHECK(rig.shown == "[p](Pdb) p 6*7\n[p]42\n");
}

TEST_CASE("WorkerOutput: another writer ends an open line first", "[unit]") {
  StreamRig rig(/*terminal=*/true);
  rig.write("name? ");
  REQUIRE(rig.shows("[p]name? "));
  rig.sinks->writeLog("agent line\n");
  REQUIRE(rig.shows("agent line\n"));
  rig.write("bob\n");
  REQUIRE(rig.shows("bob\n"));
  // The prompt's line is shown again, whole and prefixed, after the agent's line.
  CHECK(rig.shown == "[p]name? \nagent line\n[p]name? bob\n");
}

TEST_CASE("WorkerOutput: on a terminal a progress update rewrites its open line", "[unit]") {
  StreamRig rig(/*terminal=*/true);
  rig.write("\rstep 1");
  REQUIRE(rig.shows("[p]step 1"));
  rig.write("\rstep 2\rstep 3\n");
  REQUIRE(rig.shows("\n"));
  CHECK(rig.shown == std::string("[p]step 1\r[p]step 3") + kEraseToEndOfLine + "\n");
}

}  // namespace
