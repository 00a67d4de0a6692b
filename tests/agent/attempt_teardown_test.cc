// AttemptTeardown (attempt_teardown.h) on its own: a fake launcher records the signals, the test
// plays the workers' exits. Timers are real and short; the only waits are io_context runs
// bounded by a deadline.
#include "agent/supervision/attempt_teardown.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/asio.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;

class RecordingLauncher : public ProcessLauncher {
 public:
  Result<pid_t> spawn(const ProcessSpec&) override { return invalidArgument("not here"); }
  Status signalGroup(pid_t, int) override { return Status::ok(); }
  Status signalProcess(pid_t, int) override { return Status::ok(); }
  Status signalWorker(pid_t pid, bool, int signo) override {
    signals.emplace_back(pid, signo);
    return Status::ok();
  }
  size_t killAdoptedOrphans(const std::vector<pid_t>&) override {
    ++orphan_sweeps;
    return 0;
  }
  char stateOf(pid_t pid) override {
    auto it = states.find(pid);
    return it == states.end() ? 'S' : it->second;
  }
  std::vector<int> signalsTo(pid_t pid) const {
    std::vector<int> out;
    for (const auto& [p, s] : signals) {
      if (p == pid) out.push_back(s);
    }
    return out;
  }

  std::vector<std::pair<pid_t, int>> signals;
  std::map<pid_t, char> states;
  size_t orphan_sweeps = 0;
};

struct Fixture {
  boost::asio::io_context io;
  RecordingLauncher launcher;
  std::vector<AttemptWorker> workers;
  std::vector<std::string> calls;  // the callbacks, in order
  std::unique_ptr<AttemptTeardown> teardown;

  explicit Fixture(std::chrono::milliseconds shutdown_timeout = 50ms,
                   std::chrono::milliseconds reap_timeout = 50ms) {
    workers.resize(2);
    for (int i = 0; i < 2; ++i) {
      workers[static_cast<size_t>(i)].spec.rank = i;
      workers[static_cast<size_t>(i)].pid = 5000001 + i;  // above pid_max: never a real one
    }
    AttemptTeardown::Options options;
    options.shutdown_timeout = shutdown_timeout;
    options.reap_timeout = reap_timeout;
    options.drain_timeout = 1s;
    teardown = std::make_unique<AttemptTeardown>(
        io, launcher, workers, options,
        AttemptTeardown::Callbacks{
            [this] { calls.push_back("draining"); }, [this] { calls.push_back("drained"); },
            [this](size_t index) { calls.push_back("given_up " + std::to_string(index)); }});
  }
  // Runs the loop until `done` holds (bounded).
  bool runUntil(const std::function<bool()>& done, std::chrono::milliseconds bound = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_for(5ms);
      io.restart();
    }
    return done();
  }
  void exit(size_t index) {
    workers[index].exited = true;
    workers[index].exited_during_stop = true;
    teardown->onWorkerExited();
  }
  bool sawKill(pid_t pid) const {
    for (int s : launcher.signalsTo(pid)) {
      if (s == SIGKILL) return true;
    }
    return false;
  }
};

}  // namespace

TEST_CASE("teardown: SIGTERM, SIGKILL at the shutdown timeout, then the drain", "[unit]") {
  Fixture f;
  f.teardown->beginStop(SIGTERM, 0);
  CHECK(f.teardown->stopping());
  CHECK(f.teardown->stopSignal() == SIGTERM);
  // SIGCONT after SIGTERM: a stopped worker must wake to act on it.
  CHECK(f.launcher.signalsTo(5000001) == std::vector<int>{SIGTERM, SIGCONT});
  f.exit(0);
  CHECK(f.calls.empty());  // one worker still runs
  REQUIRE(f.runUntil([&] { return f.sawKill(5000002); }));
  f.exit(1);
  // Every worker exited: their groups' leftovers and adopted orphans are killed, and with no
  // output to wait for the attempt is drained at once.
  CHECK(f.calls == std::vector<std::string>{"draining", "drained"});
  CHECK(f.launcher.orphan_sweeps == 1);
  CHECK(f.sawKill(5000001));
  CHECK_FALSE(f.teardown->stopping());
  CHECK_FALSE(f.teardown->anyUnreaped());
}

TEST_CASE("teardown: a worker SIGKILL does not end is given up on at the reap bound", "[unit]") {
  Fixture f;
  f.launcher.states[5000002] = 'D';
  f.teardown->beginStop(SIGKILL, 3);
  f.exit(0);
  REQUIRE(f.runUntil([&] { return !f.calls.empty() && f.calls.back() == "drained"; }));
  CHECK(f.calls == std::vector<std::string>{"given_up 1", "draining", "drained"});
  CHECK(f.teardown->anyUnreaped());
  CHECK(f.workers[1].unreaped);
  CHECK(f.workers[1].exited);
  CHECK(f.workers[1].unreaped_as.state == 'D');  // as the launcher saw it (the pid is fake)
  CHECK_FALSE(f.workers[0].unreaped);
}

TEST_CASE("teardown: once cancelled or destroyed, its timers call nothing back", "[unit]") {
  Fixture f(/*shutdown_timeout=*/10ms);
  f.teardown->beginStop(SIGTERM, 0);
  f.teardown->cancel();
  CHECK_FALSE(f.teardown->stopping());
  f.runUntil([] { return false; }, 60ms);
  CHECK_FALSE(f.sawKill(5000001));  // no SIGKILL at the shutdown timeout

  f.teardown->beginStop(SIGTERM, 1);
  f.teardown.reset();
  f.runUntil([] { return false; }, 60ms);
  CHECK_FALSE(f.sawKill(5000001));
  CHECK(f.calls.empty());
}
