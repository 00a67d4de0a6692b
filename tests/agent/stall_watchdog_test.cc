// The stall watchdog on its own: real progress files in a temporary directory, real timers on an
// io_context, and a fake ProcessLauncher that records the signals and the gdb helpers it was
// asked for (the test plays the helpers' exits). Every wait is an io_context run bounded by a
// deadline.
#include "agent/supervision/stall_watchdog.h"

#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "agent/supervision/stall_verdict.h"
#include "common/asio.h"
#include "common/progress_file.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// Records every call, in order, in `log` (shared with the watchdog's callbacks).
class RecordingLauncher : public ProcessLauncher {
 public:
  explicit RecordingLauncher(std::vector<std::string>& log) : log_(log) {}
  Result<pid_t> spawn(const ProcessSpec& spec) override {
    spawned.push_back(spec);
    const pid_t pid = next_pid++;
    log_.push_back("spawn " + spec.argv.at(0) + " " + std::to_string(pid));
    return pid;
  }
  Status signalGroup(pid_t pgid, int signo) override {
    log_.push_back("group " + std::to_string(pgid) + " " + std::to_string(signo));
    return Status::ok();
  }
  Status signalProcess(pid_t pid, int signo) override {
    log_.push_back("signal " + std::to_string(pid) + " " + std::to_string(signo));
    return Status::ok();
  }
  Status signalWorker(pid_t pid, bool, int signo) override { return signalGroup(pid, signo); }
  size_t killAdoptedOrphans(const std::vector<pid_t>&) override { return 0; }

  std::vector<ProcessSpec> spawned;
  pid_t next_pid = 6000001;  // above any real pid_max: a slip cannot signal a real process

 private:
  std::vector<std::string>& log_;
};

std::string joined(const std::vector<size_t>& indices) {
  std::string text;
  for (size_t i : indices) text += (text.empty() ? "" : ",") + std::to_string(i);
  return text;
}

struct Fixture {
  boost::asio::io_context io;
  testing::TempDir dir;
  std::vector<std::string> log;  // launcher calls and callbacks, in order
  RecordingLauncher launcher{log};
  std::vector<SteadyClock::time_point> stalled_at;
  bool collected = false;
  std::unique_ptr<StallWatchdog> watchdog;

  void make(StallOptions options, bool track_progress = false) {
    StallWatchdog::Callbacks callbacks;
    callbacks.on_stalled = [this](const std::vector<size_t>& indices) {
      stalled_at.push_back(SteadyClock::now());
      log.push_back("stalled " + joined(indices));
    };
    callbacks.on_collected = [this](const std::vector<size_t>& indices) {
      collected = true;
      log.push_back("collected " + joined(indices));
    };
    watchdog = std::make_unique<StallWatchdog>(io, launcher, std::move(options), track_progress,
                                               nullptr, std::move(callbacks));
  }
  std::string rankDir(size_t index) { return dir.path() + "/attempt_0/" + std::to_string(index); }
  // An attempt of `n` workers, pids 100+index, each with its rank directory; checks running.
  void startAttempt(size_t n) {
    watchdog->beginAttempt(0, n);
    for (size_t i = 0; i < n; ++i) {
      std::filesystem::create_directories(rankDir(i));
      watchdog->workerStarted(
          i, {static_cast<int>(i), static_cast<int>(i), static_cast<pid_t>(100 + i), rankDir(i)});
    }
    watchdog->startChecks();
  }
  bool runUntil(const std::function<bool()>& done, std::chrono::milliseconds bound = 5s) {
    const auto deadline = SteadyClock::now() + bound;
    while (!done() && SteadyClock::now() < deadline) {
      io.run_for(5ms);
      io.restart();
    }
    return done();
  }
};

}  // namespace

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: a worker whose progress stops is stalled after the timeout and "
                 "not before while one that keeps reporting is not",
                 "[unit]") {
  StallOptions options;
  options.timeout = 200ms;
  options.check_interval = 10ms;
  make(options);
  startAttempt(2);
  ProgressReporter quits(StallWatchdog::progressFile(rankDir(0)));
  ProgressReporter keeps(StallWatchdog::progressFile(rankDir(1)));
  REQUIRE(quits.active());
  REQUIRE(keeps.active());
  // Both report for two timeouts: nothing is stalled.
  uint64_t step = 0;
  auto last_report = SteadyClock::now();
  const auto both_until = SteadyClock::now() + 400ms;
  runUntil(
      [&] {
        ++step;
        quits.bump(step);
        keeps.bump(step);
        last_report = SteadyClock::now();
        return last_report >= both_until;
      },
      2s);
  CHECK(stalled_at.empty());
  CHECK(watchdog->stallsTotal() == 0);
  // Rank 0 stops; rank 1 goes on. Rank 0 is stalled no sooner than the timeout after its last
  // report, and within a bound.
  const auto quit_at = last_report;
  const uint64_t quit_step = step;
  REQUIRE(runUntil(
      [&] {
        keeps.bump(++step);
        return !stalled_at.empty();
      },
      3s));
  CHECK(stalled_at.front() - quit_at >= options.timeout);
  CHECK(log.at(0) == "stalled 0");  // rank 1 is not in it
  CHECK(watchdog->stallsTotal() == 1);
  const WorkerProgress& stalled = watchdog->worker(0);
  CHECK(stalled.stalled);
  CHECK(stalled.progress == quit_step);
  CHECK_THAT(stalled.stall_message, Catch::StartsWith("stalled: no progress for"));
  CHECK_THAT(stalled.stall_message,
             Catch::Contains("last progress report: " + std::to_string(quit_step)));
  CHECK_FALSE(watchdog->worker(1).stalled);
  watchdog->refresh();
  CHECK(watchdog->worker(1).progress == step);
  // No gdb, no faulthandler: collection ends at once, and says why there are no stacks.
  REQUIRE(runUntil([&] { return collected; }));
  REQUIRE(stalled.stack_excerpt.size() == 1);
  CHECK_THAT(stalled.stack_excerpt[0], Catch::StartsWith("no stacks: gdb was not found"));
  // Rank 1 keeps reporting for another two timeouts after the stall: still not stalled.
  const auto more_until = SteadyClock::now() + 400ms;
  runUntil(
      [&] {
        keeps.bump(++step);
        return SteadyClock::now() >= more_until;
      },
      2s);
  CHECK(stalled_at.size() == 1);
  CHECK_FALSE(watchdog->worker(1).stalled);
}

TEST_CASE_METHOD(
    Fixture,
    "stall watchdog: a Python rank gives its faulthandler stacks, a native rank gdb's, "
    "and the stall is reported once every gdb exited",
    "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.check_interval = 10ms;
  options.faulthandler_grace = 20ms;
  options.gdb_path = "/opt/fake/gdb";
  make(options);
  // Rank 0's helper registered faulthandler: it created its stack file. Rank 1 is native.
  std::filesystem::create_directories(rankDir(0));
  std::ofstream(StallWatchdog::stackFile(rankDir(0))) << "old dump\n  File \"old.py\", line 1\n";
  startAttempt(2);
  REQUIRE(runUntil([&] { return launcher.spawned.size() == 1; }));
  // The faulthandler wrote its dump between SIGUSR1 and gdb.
  std::ofstream(StallWatchdog::stackFile(rankDir(0)), std::ios::app)
      << "Current thread 0x1 (most recent call first):\n  File \"t.py\", line 3 in hang\n";
  // gdb only for the native rank: on a torch process it would not finish within the bound.
  const ProcessSpec& gdb = launcher.spawned[0];
  CHECK(gdb.argv.front() == "/opt/fake/gdb");
  CHECK(std::find(gdb.argv.begin(), gdb.argv.end(), "101") != gdb.argv.end());
  // gdb writes its stacks; nothing is reported until it exits.
  std::ofstream(rankDir(1) + "/stacks_gdb.txt", std::ios::app)
      << "Thread 1 (LWP 9):\n#0  pause () at pause.c:29\n";
  io.run_for(50ms);
  io.restart();
  CHECK_FALSE(collected);
  CHECK_FALSE(watchdog->onChildExit(4242, 0));  // not a helper of the watchdog
  CHECK(watchdog->onChildExit(6000001, 0));
  CHECK(collected);
  CHECK(log == std::vector<std::string>{"signal 100 " + std::to_string(SIGUSR1), "stalled 0,1",
                                        "spawn /opt/fake/gdb 6000001", "collected 0,1"});
  const auto& python = watchdog->worker(0).stack_excerpt;
  REQUIRE(python.size() == 3);
  CHECK_THAT(python[0], Catch::StartsWith("Python stacks (faulthandler, "));
  CHECK(python[1] == "Current thread 0x1 (most recent call first):");  // not the old dump
  CHECK(python[2] == "  File \"t.py\", line 3 in hang");
  const auto& native = watchdog->worker(1).stack_excerpt;
  REQUIRE(native.size() == 3);
  CHECK_THAT(native[0], Catch::StartsWith("native stacks (gdb, "));
  CHECK(native[1] == "Thread 1 (LWP 9):");
  CHECK(native[2] == "#0  pause () at pause.c:29");
  // Every rank's state: the Python rank's innermost frame; no collective record from either.
  const auto& states = watchdog->rankStates();
  REQUIRE(states.size() == 2);
  CHECK(states[0].frame == "t.py:3 in hang");
  CHECK(states[0].stalled);
  CHECK_FALSE(states[0].collective.has_value());
  CHECK(states[1].frame.empty());
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: at a stall every rank is looked at, stalled or not, and its "
                 "collective record read",
                 "[unit]") {
  StallOptions options;
  options.timeout = 100ms;
  options.check_interval = 10ms;
  options.faulthandler_grace = 10ms;
  make(options);
  startAttempt(3);
  // Rank 0 waits in all_reduce #5 (stalls); rank 1 keeps stamping progress (a busy culprit that
  // never entered it); rank 2 exited after all_reduce #4.
  std::ofstream(StallWatchdog::collectiveFile(rankDir(0)))
      << formatCollectiveRecord({true, "all_reduce", "world", 5});
  std::ofstream(StallWatchdog::collectiveFile(rankDir(1)))
      << formatCollectiveRecord({false, "all_reduce", "world", 4});
  std::ofstream(StallWatchdog::collectiveFile(rankDir(2))) << "in garbage";
  watchdog->workerExited(2);
  ProgressReporter keeps(StallWatchdog::progressFile(rankDir(1)));
  uint64_t step = 0;
  REQUIRE(runUntil([&] {
    keeps.bump(++step);
    return collected;
  }));
  CHECK(log.front() == "stalled 0");
  const auto& states = watchdog->rankStates();
  REQUIRE(states.size() == 3);
  CHECK(states[0].stalled);
  REQUIRE(states[0].collective.has_value());
  CHECK(states[0].collective->inside);
  CHECK(states[0].collective->seq == 5);
  CHECK_FALSE(states[1].stalled);
  REQUIRE(states[1].collective.has_value());
  CHECK_FALSE(states[1].collective->inside);
  CHECK(states[2].exited);
  CHECK_FALSE(states[2].collective.has_value());  // a malformed record is no record
  auto verdict = decideStall(states);
  REQUIRE(verdict.has_value());
  REQUIRE(verdict->culprits.size() == 2);
  CHECK(states[verdict->culprits[0]].rank == 1);
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: a peer's stall takes a snapshot without declaring a stall here",
                 "[unit]") {
  StallOptions options;
  options.timeout = 10s;
  options.check_interval = 10ms;
  options.faulthandler_grace = 10ms;
  make(options);
  std::filesystem::create_directories(rankDir(0));
  std::ofstream(StallWatchdog::stackFile(rankDir(0))).flush();
  startAttempt(1);
  std::ofstream(StallWatchdog::collectiveFile(rankDir(0)))
      << formatCollectiveRecord({false, "broadcast", "world", 2});
  bool done = false;
  watchdog->collectForPeer([&] { done = true; });
  REQUIRE(runUntil([&] { return done; }));
  CHECK_FALSE(collected);  // not this node's stall: on_collected is for its own
  CHECK(log == std::vector<std::string>{"signal 100 " + std::to_string(SIGUSR1)});
  CHECK(watchdog->stallsTotal() == 0);
  REQUIRE(watchdog->rankStates().size() == 1);
  CHECK_FALSE(watchdog->rankStates()[0].stalled);
  CHECK(watchdog->rankStates()[0].collective->op == "broadcast");
}

TEST_CASE_METHOD(Fixture, "stall watchdog: a gdb that hangs is killed at its bound", "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.check_interval = 10ms;
  options.gdb_path = "/opt/fake/gdb";
  options.stacks_timeout = 100ms;
  make(options);
  startAttempt(1);
  REQUIRE(runUntil([&] { return launcher.spawned.size() == 1; }));
  const auto spawned_at = SteadyClock::now();
  const std::string kill = "group 6000001 " + std::to_string(SIGKILL);
  REQUIRE(runUntil([&] { return std::find(log.begin(), log.end(), kill) != log.end(); }));
  CHECK(SteadyClock::now() - spawned_at >= 90ms);
  CHECK_FALSE(collected);
  // The reaper reports the killed gdb: the collection ends with what gdb left.
  CHECK(watchdog->onChildExit(6000001, SIGKILL));
  CHECK(collected);
  const auto& excerpt = watchdog->worker(0).stack_excerpt;
  REQUIRE(excerpt.size() == 1);
  CHECK_THAT(excerpt[0], Catch::StartsWith("gdb gave no stack"));
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: a new attempt abandons the collection and a late gdb of it is "
                 "ignored",
                 "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.check_interval = 10ms;
  options.gdb_path = "/opt/fake/gdb";
  make(options);
  startAttempt(1);
  REQUIRE(runUntil([&] { return launcher.spawned.size() == 1; }));
  watchdog->stopChecks();
  watchdog->beginAttempt(1, 1);
  CHECK_FALSE(watchdog->worker(0).stalled);
  CHECK(watchdog->onChildExit(6000001, SIGKILL));  // consumed, but it reports nothing
  io.run_for(30ms);
  io.restart();
  CHECK_FALSE(collected);
  CHECK(watchdog->stallsTotal() == 1);  // counted over the job
}

TEST_CASE_METHOD(Fixture, "stall watchdog: an exited worker and stopped checks declare no stall",
                 "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.check_interval = 10ms;
  make(options);
  startAttempt(2);
  watchdog->workerExited(0);
  REQUIRE(runUntil([&] { return !stalled_at.empty(); }));
  CHECK(log.front() == "stalled 1");
  REQUIRE(runUntil([&] { return collected; }));
  // The next attempt's workers are silent too, but nothing checks them while checks are off.
  watchdog->beginAttempt(1, 1);
  watchdog->workerStarted(0, {0, 0, 200, rankDir(0)});
  io.run_for(150ms);
  io.restart();
  CHECK(stalled_at.size() == 1);
  CHECK_FALSE(watchdog->worker(0).stalled);
}

TEST_CASE_METHOD(Fixture, "stall watchdog: progress is tracked for status with detection off",
                 "[unit]") {
  make(StallOptions{}, /*track_progress=*/true);
  CHECK_FALSE(watchdog->stallDetectionOn());
  startAttempt(1);
  ProgressReporter progress(StallWatchdog::progressFile(rankDir(0)));
  progress.bump(7);
  watchdog->refresh();
  CHECK(watchdog->worker(0).progress == 7u);
  io.run_for(100ms);
  io.restart();
  CHECK(stalled_at.empty());
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: a worker that has not reported yet is bounded by the first "
                 "timeout, then by the timeout between reports",
                 "[unit]") {
  StallOptions options;
  options.timeout = 60ms;
  options.first_timeout = 400ms;
  options.check_interval = 10ms;
  make(options);
  const auto start = SteadyClock::now();
  startAttempt(2);
  // Worker 1 reports once, early; worker 0 never does.
  ProgressReporter progress(StallWatchdog::progressFile(rankDir(1)));
  progress.bump(1);
  REQUIRE(runUntil([&] { return !stalled_at.empty(); }));
  CHECK(log.front() == "stalled 1");  // silent for 60 ms after its report, long before 400 ms
  CHECK(stalled_at.front() - start < 300ms);
  CHECK(watchdog->worker(1).stall_message.rfind("stalled: no progress for", 0) == 0);
  REQUIRE(runUntil([&] { return collected; }));
  collected = false;
  REQUIRE(runUntil([&] { return stalled_at.size() == 2; }));
  CHECK(std::find(log.begin(), log.end(), "stalled 0") != log.end());
  CHECK(stalled_at.back() - start >= 400ms);  // the first timeout, not the 60 ms one
  CHECK_THAT(watchdog->worker(0).stall_message,
             Catch::StartsWith("stalled: no first progress in") &&
                 Catch::Contains("--stall-first-timeout") &&
                 Catch::Contains("it never reported progress"));
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: a worker whose program ended (the .exiting marker) is bounded "
                 "by the first timeout while it exits",
                 "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.first_timeout = 300ms;
  options.check_interval = 10ms;
  make(options);
  startAttempt(1);
  ProgressReporter progress(StallWatchdog::progressFile(rankDir(0)));
  progress.bump(1);
  std::ofstream(StallWatchdog::progressFile(rankDir(0)) + ".exiting").flush();
  const auto marked = SteadyClock::now();
  REQUIRE(runUntil([&] { return !stalled_at.empty(); }));
  CHECK(stalled_at.front() - marked >= 280ms);
  CHECK_THAT(watchdog->worker(0).stall_message,
             Catch::StartsWith("stalled while exiting after its program ended"));
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: with stacks off a stall is reported at once, with no SIGUSR1 "
                 "and no gdb",
                 "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.check_interval = 10ms;
  options.gdb_path = "/opt/fake/gdb";
  options.stacks_timeout = 0ms;
  make(options);
  startAttempt(1);
  std::ofstream(StallWatchdog::stackFile(rankDir(0))).flush();  // a faulthandler is registered
  REQUIRE(runUntil([&] { return collected; }));
  CHECK(launcher.spawned.empty());
  for (const std::string& entry : log) CHECK(entry.rfind("signal ", 0) != 0);
  REQUIRE(watchdog->worker(0).stack_excerpt.size() == 1);
  CHECK(watchdog->worker(0).stack_excerpt[0] == "no stacks: --stall-stacks-timeout off");
}

TEST_CASE_METHOD(Fixture,
                 "stall watchdog: stacks not in by the bound are abandoned: gdb killed, its rank "
                 "sent SIGCONT, the stall reported",
                 "[unit]") {
  StallOptions options;
  options.timeout = 50ms;
  options.check_interval = 10ms;
  options.gdb_path = "/opt/fake/gdb";
  options.stacks_timeout = 150ms;
  make(options);
  startAttempt(1);
  REQUIRE(runUntil([&] { return !stalled_at.empty(); }));
  const auto stalled = stalled_at.front();
  // The fake gdb never exits (the launcher records its SIGKILL but plays no exit).
  REQUIRE(runUntil([&] { return collected; }, 3s));
  const auto took = SteadyClock::now() - stalled;
  CHECK(took >= 150ms);
  CHECK(took < 1s);
  CHECK(std::find(log.begin(), log.end(), "group 6000001 9") != log.end());
  CHECK(std::find(log.begin(), log.end(), "signal 100 18") != log.end());  // SIGCONT
}
