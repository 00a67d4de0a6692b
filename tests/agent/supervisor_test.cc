// The supervisor's decisions without real workers: a fake ProcessLauncher records what it was
// asked, and the test plays the workers (writes their output, makes them exit). Output pipes and
// timers are real; the only waits are io_context runs bounded by a deadline.
#include "agent/supervision/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "common/asio.h"
#include "common/progress_file.h"
#include "common/system.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;

int exitedWith(int code) { return (code & 0xff) << 8; }  // a wait status, as waitpid reports
int killedBy(int signo) { return signo & 0x7f; }

class FakeLauncher : public ProcessLauncher {
 public:
  struct Process {
    ProcessSpec spec;
    pid_t pid;
    int out = -1;  // the fake worker's ends of the output pipes
    int err = -1;
  };

  Result<pid_t> spawn(const ProcessSpec& spec) override {
    if (fail_spawn_at == static_cast<int>(spawned.size())) {
      return invalidArgument("cannot run '" + spec.argv.at(0) + "': no such file");
    }
    Process p{spec, next_pid++, ::dup(spec.stdout_fd), ::dup(spec.stderr_fd)};
    spawned.push_back(p);
    return p.pid;
  }
  Status signalGroup(pid_t pgid, int signo) override {
    signals.emplace_back(pgid, signo);
    if (on_signal) on_signal(pgid, signo);
    return Status::ok();
  }
  Status signalProcess(pid_t pid, int signo) override {
    process_signals.emplace_back(pid, signo);
    return Status::ok();
  }
  Status signalWorker(pid_t pid, bool, int signo) override { return signalGroup(pid, signo); }
  size_t killAdoptedOrphans(const std::vector<pid_t>&) override {
    ++orphan_sweeps;
    return 0;
  }
  // What /proc would say of a fake worker: 'S' unless a test set it ('D': uninterruptible).
  char stateOf(pid_t pid) override {
    auto it = states.find(pid);
    return it == states.end() ? 'S' : it->second;
  }
  std::map<pid_t, char> states;

  // The fake worker writes to its stdout/stderr.
  void write(pid_t pid, bool to_stderr, const std::string& text) {
    Process& p = find(pid);
    REQUIRE(::write(to_stderr ? p.err : p.out, text.data(), text.size()) ==
            static_cast<ssize_t>(text.size()));
  }
  // The fake worker exits: its pipes close, then the reaper would report it.
  void exit(Supervisor& supervisor, pid_t pid, int status) {
    Process& p = find(pid);
    if (p.out >= 0) ::close(p.out);
    if (p.err >= 0) ::close(p.err);
    p.out = p.err = -1;
    supervisor.onChildExit(pid, status);
  }
  Process& find(pid_t pid) {
    for (auto& p : spawned) {
      if (p.pid == pid) return p;
    }
    FAIL("no fake process " << pid);
    throw std::logic_error("unreachable");
  }
  std::vector<int> signalsTo(pid_t pgid) const {
    std::vector<int> out;
    for (const auto& [g, s] : signals) {
      if (g == pgid) out.push_back(s);
    }
    return out;
  }
  ~FakeLauncher() override {
    for (auto& p : spawned) {
      if (p.out >= 0) ::close(p.out);
      if (p.err >= 0) ::close(p.err);
    }
  }

  std::vector<Process> spawned;
  std::vector<std::pair<pid_t, int>> signals;
  std::vector<std::pair<pid_t, int>> process_signals;
  std::function<void(pid_t, int)> on_signal;
  int fail_spawn_at = -1;
  size_t orphan_sweeps = 0;
  pid_t next_pid = 5000001;  // above any real pid_max: a slip cannot signal a real process
};

// A coordinator the test drives: it keeps the start and decision callbacks for the test to
// call, as the real one posts them from its own threads.
class FakeCoordinator : public JobCoordinator {
 public:
  void beginAttempt(int restart_count, StartDone done) override {
    begun.push_back(restart_count);
    start = std::move(done);
  }
  void announceStop(int restart_count, const std::string& reason, int) override {
    announced.emplace_back(restart_count, reason);
  }
  void endAttempt(int, const AttemptReport& r, DecisionDone done) override {
    reports.push_back(r);
    decide = std::move(done);
  }
  RendezvousProgress progress() const override { return {}; }

  std::vector<int> begun;
  StartDone start;
  std::vector<std::pair<int, std::string>> announced;
  std::vector<AttemptReport> reports;
  DecisionDone decide;
};

// The content of the file at `path`, "" when it cannot be read.
std::string fileText(const std::string& path) {
  Result<std::string> text = readFile(path);
  return text.isOk() ? std::move(text).value() : std::string();
}

struct Fixture {
  boost::asio::io_context io;
  FakeLauncher launcher;
  testing::TempDir dir;
  std::string console_path = dir.path() + "/console.txt";
  int console_fd = ::open(console_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::optional<JobOutcome> outcome;
  std::vector<int> attempts_prepared;
  int nproc = 2;
  bool with_attempt_dir = false;  // give every attempt a directory (progress files, stacks)
  std::shared_ptr<OutputSinks> sinks;
  std::unique_ptr<Supervisor> supervisor;

  ~Fixture() {
    supervisor.reset();
    if (sinks) sinks->stop(5s, 5s);
    ::close(console_fd);
  }

  // The console as written so far (the writer thread writes it: wait for what is queued).
  std::string consoleText() {
    REQUIRE(sinks->flush(5s));
    return fileText(console_path);
  }

  void make(SupervisorOptions options) {
    options.output.console_stdout_fd = console_fd;
    options.output.console_stderr_fd = console_fd;
    sinks = std::make_shared<OutputSinks>(console_fd, console_fd);
    options.sinks = sinks;
    supervisor = std::make_unique<Supervisor>(
        io, launcher, options,
        [this](int restart) -> Result<AttemptSpec> {
          attempts_prepared.push_back(restart);
          AttemptSpec a;
          if (with_attempt_dir) a.attempt_dir = dir.path() + "/attempt_" + std::to_string(restart);
          for (int i = 0; i < nproc; ++i) {
            WorkerSpec w;
            w.local_rank = i;
            w.rank = i;
            w.argv = {"worker", std::to_string(restart)};
            w.env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart);
            a.workers.push_back(w);
          }
          return a;
        },
        [this](const JobOutcome& o) { outcome = o; });
    supervisor->start();
  }
  // Runs the loop until `done` holds (bounded).
  bool runUntil(const std::function<bool()>& done, std::chrono::milliseconds bound = 5s) {
    auto deadline = std::chrono::steady_clock::now() + bound;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_for(10ms);
      io.restart();
    }
    return done();
  }
  pid_t pidOf(size_t index) { return launcher.spawned.at(index).pid; }
  // A supervisor of one node of several: it has asked `coordinator` to begin attempt 0.
  void makeMultiNode(FakeCoordinator& coordinator) {
    SupervisorOptions options;
    options.coordinator = &coordinator;
    make(options);
    REQUIRE(runUntil([&] { return !coordinator.begun.empty(); }));
  }
};

}  // namespace

TEST_CASE_METHOD(Fixture, "all workers exiting 0 ends the job with 0 and their output prefixed",
                 "[unit]") {
  make({});
  REQUIRE(launcher.spawned.size() == 2);
  CHECK(launcher.spawned[0].spec.argv == std::vector<std::string>{"worker", "0"});
  launcher.write(pidOf(0), false, "hello from ");
  launcher.write(pidOf(1), true, "rank one\n");
  launcher.write(pidOf(0), false, "zero\nunterminated");
  launcher.exit(*supervisor, pidOf(0), exitedWith(0));
  CHECK(!supervisor->done());
  launcher.exit(*supervisor, pidOf(1), exitedWith(0));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kSucceeded);
  CHECK(outcome->exitCode() == 0);
  std::string console = consoleText();
  CHECK(console.find("[default0]:hello from zero\n") != std::string::npos);
  CHECK(console.find("[default1]:rank one\n") != std::string::npos);
  // The unterminated last line is not lost.
  CHECK(console.find("[default0]:unterminated\n") != std::string::npos);
  // Leftovers in the groups are swept once the workers are gone; nothing was SIGTERMed.
  for (size_t i = 0; i < 2; ++i) CHECK(launcher.signalsTo(pidOf(i)) == std::vector<int>{SIGKILL});
  CHECK(launcher.orphan_sweeps == 1);
}

TEST_CASE_METHOD(Fixture, "the first failure stops every group and a restart follows", "[unit]") {
  SupervisorOptions options;
  options.max_restarts = 1;
  make(options);
  launcher.on_signal = [&](pid_t pgid, int signo) {
    if (signo == SIGTERM && pgid == pidOf(0)) {
      boost::asio::post(io, [&, pgid] { launcher.exit(*supervisor, pgid, killedBy(SIGTERM)); });
    }
  };
  launcher.write(pidOf(1), true, "Traceback: boom\n");
  launcher.exit(*supervisor, pidOf(1), exitedWith(3));
  // SIGTERM went to both groups at once, including the failed one (its grandchildren), and
  // SIGCONT after it, so a stopped worker acts on it.
  CHECK(launcher.signalsTo(pidOf(0)) == std::vector<int>{SIGTERM, SIGCONT});
  CHECK(launcher.signalsTo(pidOf(1)) == std::vector<int>{SIGTERM, SIGCONT});
  REQUIRE(runUntil([&] { return launcher.spawned.size() == 4; }));
  CHECK(attempts_prepared == std::vector<int>{0, 1});
  CHECK(supervisor->restartCount() == 1);
  launcher.exit(*supervisor, pidOf(2), exitedWith(0));
  launcher.exit(*supervisor, pidOf(3), exitedWith(0));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kSucceeded);
  CHECK(outcome->restarts == 1);
}

TEST_CASE_METHOD(Fixture, "with no restarts left the failures name the root cause and its stderr",
                 "[unit]") {
  make({});
  launcher.on_signal = [&](pid_t pgid, int signo) {
    if (signo == SIGTERM && pgid == pidOf(1)) {
      boost::asio::post(io, [&, pgid] { launcher.exit(*supervisor, pgid, killedBy(SIGTERM)); });
    }
  };
  launcher.write(pidOf(0), true, "first line\nRuntimeError: out of memory\n");
  launcher.exit(*supervisor, pidOf(0), exitedWith(7));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kWorkersFailed);
  CHECK(outcome->exitCode() == 1);
  REQUIRE(outcome->failures.size() == 2);
  const WorkerFailure& root = outcome->failures[rootCauseIndex(outcome->failures)];
  CHECK(root.rank == 0);
  CHECK(root.exit_code == 7);
  CHECK_FALSE(root.teardown);
  CHECK(root.stderr_tail == std::vector<std::string>{"first line", "RuntimeError: out of memory"});
  CHECK(outcome->failures[1].teardown);
  CHECK(outcome->failures[1].signal == SIGTERM);
}

TEST_CASE_METHOD(Fixture, "a worker that ignores SIGTERM is killed after the shutdown timeout",
                 "[unit]") {
  SupervisorOptions options;
  options.shutdown_timeout = 150ms;
  make(options);
  std::optional<std::chrono::steady_clock::time_point> killed_at;
  auto failed_at = std::chrono::steady_clock::now();
  launcher.on_signal = [&](pid_t pgid, int signo) {
    if (signo == SIGKILL && pgid == pidOf(0) && !killed_at) {
      killed_at = std::chrono::steady_clock::now();
      boost::asio::post(io, [&, pgid] { launcher.exit(*supervisor, pgid, killedBy(SIGKILL)); });
    }
  };
  launcher.exit(*supervisor, pidOf(1), killedBy(SIGSEGV));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  REQUIRE(killed_at.has_value());
  CHECK(*killed_at - failed_at >= 150ms);
  CHECK(*killed_at - failed_at < 2s);
  CHECK(launcher.signalsTo(pidOf(0)).front() == SIGTERM);
  CHECK(outcome->kind == JobOutcome::Kind::kWorkersFailed);
  const WorkerFailure& root = outcome->failures[rootCauseIndex(outcome->failures)];
  CHECK(root.rank == 1);
  CHECK(root.signal == SIGSEGV);
}

TEST_CASE_METHOD(Fixture, "a handled signal is forwarded to every group and ends the job",
                 "[unit]") {
  SupervisorOptions options;
  options.max_restarts = 3;
  make(options);
  supervisor->onSignal(SIGUSR1);
  CHECK(launcher.signalsTo(pidOf(0)) == std::vector<int>{SIGUSR1});
  CHECK(launcher.signalsTo(pidOf(1)) == std::vector<int>{SIGUSR1});
  // The workers checkpoint and exit (one cleanly, one by the signal): no restart follows.
  launcher.exit(*supervisor, pidOf(0), exitedWith(0));
  launcher.exit(*supervisor, pidOf(1), killedBy(SIGUSR1));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kSignalled);
  CHECK(outcome->exitCode() == 128 + SIGUSR1);
  CHECK(attempts_prepared == std::vector<int>{0});
}

TEST_CASE_METHOD(Fixture, "a worker that cannot be started stops the ones that were", "[unit]") {
  launcher.fail_spawn_at = 1;
  launcher.on_signal = [&](pid_t pgid, int signo) {
    if (signo == SIGKILL && pgid == pidOf(0)) {
      boost::asio::post(io, [&, pgid] { launcher.exit(*supervisor, pgid, killedBy(SIGKILL)); });
    }
  };
  SupervisorOptions options;
  options.max_restarts = 2;
  make(options);
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kStartFailed);
  CHECK(outcome->exitCode() == 3);
  CHECK(outcome->error.message().find("rank 1") != std::string::npos);
  CHECK(outcome->error.message().find("no such file") != std::string::npos);
  CHECK(attempts_prepared == std::vector<int>{0});  // a missing program is not retried
}

TEST_CASE("line splitting keeps lines whole across reads and cuts runaway ones", "[unit]") {
  LineSplitter splitter(8);
  std::vector<std::string> lines;
  auto collect = [&](std::string_view l) { lines.emplace_back(l); };
  splitter.feed("ab", collect);
  splitter.feed("c\nde\n\nf", collect);
  CHECK(lines == std::vector<std::string>{"abc", "de", ""});
  splitter.feed("ghijklmnopq\n", collect);  // "fghijklmnopq": 12 bytes, limit 8
  CHECK(lines == std::vector<std::string>{"abc", "de", "", "fghijklm", "nopq"});
  splitter.feed("tail", collect);
  splitter.finish(collect);
  CHECK(lines.back() == "tail");
}

TEST_CASE("redirects tee and the rank filter decide where each stream goes", "[unit]") {
  OutputOptions o;
  o.redirects_by_rank = {{1, 3}};
  o.tee_default = 2;
  o.local_ranks_filter = {0, 1};
  WorkerOutputPlan r0 = planWorkerOutput(o, 0, 8, "/logs/0");
  CHECK(r0.out.to_console);
  CHECK(r0.out.file.empty());
  CHECK(r0.err.to_console);  // tee: console and file
  CHECK(r0.err.file == "/logs/0/stderr.log");
  CHECK(r0.out.prefix == "[default8]:");
  WorkerOutputPlan r1 = planWorkerOutput(o, 1, 9, "/logs/1");
  CHECK_FALSE(r1.out.to_console);  // redirected: file only
  CHECK(r1.out.file == "/logs/1/stdout.log");
  CHECK(r1.err.to_console);  // redirected and teed: tee wins
  WorkerOutputPlan r2 = planWorkerOutput(o, 2, 10, "/logs/2");
  CHECK_FALSE(r2.out.to_console);  // filtered out of the console
  CHECK_FALSE(r2.err.to_console);
  CHECK(r2.err.file == "/logs/2/stderr.log");  // files keep everything
  o.prefix_template = "${role_name}:${local_rank}/${rank}| ";
  o.role_name = "trainer";
  CHECK(planWorkerOutput(o, 2, 10, "").out.prefix == "trainer:2/10| ");
  CHECK(anyRedirect(o));
  CHECK_FALSE(anyRedirect(OutputOptions{}));
  // --duplicate-*-filters copy tee'd streams of ranks on the console only (torchrun's tee set).
  CHECK(r0.err.filterable);
  CHECK_FALSE(r0.out.filterable);  // not tee'd
  CHECK(r1.err.filterable);
  CHECK_FALSE(r2.err.filterable);  // tee'd, but off the console
  OutputOptions filters_only;
  filters_only.duplicate_stderr_filters = {"x"};
  CHECK(anyRedirect(filters_only));  // the filtered file needs a log directory
}

TEST_CASE_METHOD(Fixture,
                 "duplicate filters copy the matching tee'd lines of every shown rank into the "
                 "attempt's filtered files",
                 "[unit]") {
  with_attempt_dir = true;
  nproc = 3;
  SupervisorOptions options;
  options.output.tee_default = 1;  // stdout tee'd, stderr not
  options.output.local_ranks_filter = {0, 1};
  options.output.duplicate_stdout_filters = {"loss", "a,b"};
  options.output.duplicate_stderr_filters = {""};  // matches every line, but nothing is tee'd
  make(options);
  REQUIRE(launcher.spawned.size() == 3);
  launcher.write(pidOf(0), false, "step 1 loss 0.5\nstep 1 acc 0.1\nsplit lo");
  launcher.write(pidOf(0), false, "ss here\n");
  launcher.write(pidOf(1), false, "a,b and c\nloss without newline");
  launcher.write(pidOf(1), true, "loss on stderr\n");
  launcher.write(pidOf(2), false, "loss of rank 2, off the console\n");
  for (size_t i = 0; i < 3; ++i) launcher.exit(*supervisor, pidOf(i), exitedWith(0));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  REQUIRE(sinks->flush(5s));
  const std::string attempt = dir.path() + "/attempt_0";
  const std::string out = fileText(attempt + "/filtered_stdout.log");
  INFO(out);
  REQUIRE_FALSE(out.empty());
  std::vector<std::string> rank0, rank1;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    (line.rfind("[default0]:", 0) == 0 ? rank0 : rank1).push_back(line);
  }
  CHECK(rank0 ==
        std::vector<std::string>{"[default0]:step 1 loss 0.5", "[default0]:split loss here"});
  // The unterminated last line is copied whole, with its newline.
  CHECK(rank1 ==
        std::vector<std::string>{"[default1]:a,b and c", "[default1]:loss without newline"});
  CHECK(out.back() == '\n');
  CHECK(std::filesystem::exists(attempt + "/filtered_stderr.log"));
  CHECK(fileText(attempt + "/filtered_stderr.log").empty());
}

TEST_CASE_METHOD(Fixture,
                 "a worker silent for the stall timeout is stalled: gdb's stacks, then it is "
                 "the attempt's root cause with its stacks",
                 "[unit]") {
  SupervisorOptions options;
  options.stall.timeout = 200ms;
  options.stall.check_interval = 20ms;
  options.stall.faulthandler_grace = 10ms;
  options.stall.gdb_path = "/opt/fake/gdb";
  with_attempt_dir = true;
  make(options);
  REQUIRE(launcher.spawned.size() == 2);
  const std::string rank_dir = dir.path() + "/attempt_0/1";
  CHECK(launcher.spawned[1].spec.env.at("CPPRUN_PROGRESS_FILE") == rank_dir + "/progress");
  CHECK(launcher.spawned[1].spec.env.at("CPPRUN_STACK_FILE") == rank_dir + "/python_stacks.txt");
  CHECK(launcher.spawned[1].spec.env.at("CPPRUN_COLLECTIVE_FILE") == rank_dir + "/collective");
  // Rank 1 is a native program (no faulthandler stack file); rank 0 is done.
  launcher.exit(*supervisor, pidOf(0), exitedWith(0));
  // gdb, on that pid, writing into the rank's directory (a Python rank gets SIGUSR1 instead:
  // stall_watchdog_test).
  REQUIRE(runUntil([&] { return launcher.spawned.size() == 3; }));
  const auto& gdb = launcher.spawned[2];
  CHECK(gdb.spec.argv.front() == "/opt/fake/gdb");
  CHECK(std::find(gdb.spec.argv.begin(), gdb.spec.argv.end(), std::to_string(pidOf(1))) !=
        gdb.spec.argv.end());
  CHECK(launcher.signalsTo(pidOf(1)).empty());  // nothing stops it before the stacks are in
  launcher.write(gdb.pid, false, "Thread 1 (LWP 9):\n#0  pause () at pause.c:29\n");
  launcher.exit(*supervisor, gdb.pid, exitedWith(0));
  REQUIRE(runUntil([&] { return !launcher.signalsTo(pidOf(1)).empty(); }));
  CHECK(launcher.signalsTo(pidOf(1)) == std::vector<int>{SIGTERM, SIGCONT});
  CHECK(supervisor->snapshot().stalls_total == 1);
  CHECK(supervisor->snapshot().workers[1].stalled);
  launcher.exit(*supervisor, pidOf(1), killedBy(SIGTERM));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kWorkersFailed);
  REQUIRE(outcome->failures.size() == 1);
  const WorkerFailure& f = outcome->failures[0];
  CHECK(f.rank == 1);
  CHECK_FALSE(f.teardown);  // the agent ended it, but the stall is the failure
  CHECK_THAT(f.message, Catch::StartsWith("stalled: no first progress in"));
  CHECK_THAT(f.message, Catch::Contains("--stall-first-timeout"));
  CHECK_THAT(f.message, Catch::Contains("it never reported progress"));
  CHECK_THAT(f.traceback, Catch::Contains("#0  pause () at pause.c:29"));
}

TEST_CASE_METHOD(Fixture, "a worker that keeps reporting progress is never stalled", "[unit]") {
  SupervisorOptions options;
  options.stall.timeout = 150ms;
  options.stall.check_interval = 10ms;
  with_attempt_dir = true;
  nproc = 1;
  make(options);
  REQUIRE(launcher.spawned.size() == 1);
  cpprun::ProgressReporter progress(dir.path() + "/attempt_0/0/progress");
  REQUIRE(progress.active());
  // Steps of about 10 ms for 4 stall timeouts; the file's modification time moves each time.
  const auto until = std::chrono::steady_clock::now() + 600ms;
  uint64_t step = 0;
  runUntil(
      [&] {
        progress.bump(++step);
        return std::chrono::steady_clock::now() >= until;
      },
      2s);
  CHECK(launcher.signalsTo(pidOf(0)).empty());
  CHECK(launcher.spawned.size() == 1);
  CHECK(supervisor->snapshot().stalls_total == 0);
  CHECK(supervisor->snapshot().workers[0].progress == step);
  launcher.exit(*supervisor, pidOf(0), exitedWith(0));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kSucceeded);
}

TEST_CASE_METHOD(Fixture, "a peer's stop that arrives before the attempt's start stops its workers",
                 "[unit]") {
  FakeCoordinator coordinator;
  makeMultiNode(coordinator);
  REQUIRE(coordinator.begun == std::vector<int>{0});
  // The coordinator's watcher posts another node's stop of attempt 0 before its control thread
  // posts the start: the stop must not be lost, or these workers run on alone.
  supervisor->onPeerStop(0, "node 1 (n1): could not start its workers", 0);
  AttemptStart started;
  started.attempt = 0;
  coordinator.start(started);
  REQUIRE(launcher.spawned.size() == 2);
  CHECK(launcher.signalsTo(pidOf(0)) == std::vector<int>{SIGTERM, SIGCONT});
  CHECK(launcher.signalsTo(pidOf(1)) == std::vector<int>{SIGTERM, SIGCONT});
  launcher.exit(*supervisor, pidOf(0), killedBy(SIGTERM));
  launcher.exit(*supervisor, pidOf(1), killedBy(SIGTERM));
  REQUIRE(runUntil([&] { return coordinator.reports.size() == 1; }));
  CHECK(coordinator.reports[0].kind == AttemptReport::Kind::kStopped);
  CHECK(coordinator.announced.empty());  // the stop was the other node's, not this one's
}

TEST_CASE_METHOD(Fixture, "a peer's stop of an earlier attempt does not stop the next one",
                 "[unit]") {
  FakeCoordinator coordinator;
  makeMultiNode(coordinator);
  supervisor->onPeerStop(7, "an old attempt's stop", 0);
  AttemptStart started;
  started.attempt = 8;
  coordinator.start(started);
  REQUIRE(launcher.spawned.size() == 2);
  CHECK(launcher.signalsTo(pidOf(0)).empty());
  CHECK(supervisor->restartCount() == 8);
}

TEST_CASE_METHOD(Fixture,
                 "a signal during the teardown of a start failure keeps the start failure's exit",
                 "[unit]") {
  // Worker 1 cannot be started: worker 0 gets SIGKILL. A handled signal arrives before worker 0
  // is reaped. The restart policy ranks the start failure above the signal: exit 3, not 143.
  launcher.fail_spawn_at = 1;
  SupervisorOptions options;
  options.max_restarts = 2;
  make(options);
  REQUIRE(launcher.signalsTo(pidOf(0)) == std::vector<int>{SIGKILL});
  supervisor->onSignal(SIGTERM);
  launcher.exit(*supervisor, pidOf(0), killedBy(SIGKILL));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kStartFailed);
  CHECK(outcome->exitCode() == 3);
  CHECK(attempts_prepared == std::vector<int>{0});
}

TEST_CASE("outcome names come from the enums and match the event log's spelling", "[unit]") {
  using cpprun::agent::AttemptEnd;
  using cpprun::agent::attemptEndName;
  using cpprun::agent::jobOutcomeName;
  using Kind = cpprun::agent::JobOutcome::Kind;
  CHECK(std::string(jobOutcomeName(Kind::kSucceeded)) == "succeeded");
  CHECK(std::string(jobOutcomeName(Kind::kWorkersFailed)) == "workers_failed");
  CHECK(std::string(jobOutcomeName(Kind::kSignalled)) == "signalled");
  CHECK(std::string(jobOutcomeName(Kind::kStartFailed)) == "start_failed");
  CHECK(std::string(jobOutcomeName(Kind::kLostPeers)) == "lost_peers");
  std::set<std::string> names;
  for (AttemptEnd e :
       {AttemptEnd::kLostPeers, AttemptEnd::kStartFailed, AttemptEnd::kSignalled,
        AttemptEnd::kWorkersFailed, AttemptEnd::kStoppedByPeer, AttemptEnd::kSucceeded}) {
    names.insert(attemptEndName(e));
  }
  CHECK(names.size() == 6);
  CHECK(names.count("unknown") == 0);
}

TEST_CASE_METHOD(
    Fixture, "a worker in D state for the uninterruptible timeout fails the attempt, no restart",
    "[unit]") {
  SupervisorOptions options;
  options.max_restarts = 2;
  options.uninterruptible_timeout = 300ms;
  make(options);
  launcher.on_signal = [&](pid_t pgid, int signo) {
    if (signo != SIGTERM) return;
    boost::asio::post(io, [&, pgid] { launcher.exit(*supervisor, pgid, killedBy(SIGTERM)); });
  };
  const auto began = std::chrono::steady_clock::now();
  launcher.states[pidOf(0)] = 'D';
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  // Not before the timeout; within it plus one check (100 ms for 300 ms) and a margin.
  const auto took = std::chrono::steady_clock::now() - began;
  CHECK(took >= 300ms);
  CHECK(took < 2s);
  CHECK(outcome->kind == JobOutcome::Kind::kWorkersFailed);
  CHECK(outcome->exitCode() == 1);
  CHECK(attempts_prepared == std::vector<int>{0});  // torch: restarts disabled
  REQUIRE(!outcome->failures.empty());
  const WorkerFailure& root = outcome->failures[rootCauseIndex(outcome->failures)];
  CHECK(root.rank == 0);
  CHECK(root.message.find("uninterruptible sleep for") != std::string::npos);
}

TEST_CASE_METHOD(Fixture, "a D state that ends before the uninterruptible timeout is forgotten",
                 "[unit]") {
  SupervisorOptions options;
  options.uninterruptible_timeout = 400ms;
  make(options);
  launcher.states[pidOf(0)] = 'D';
  io.run_for(250ms);
  io.restart();
  launcher.states[pidOf(0)] = 'R';  // torch's dwell starts again from the next D
  io.run_for(300ms);
  io.restart();
  launcher.states[pidOf(0)] = 'D';
  io.run_for(250ms);
  io.restart();
  CHECK(!outcome.has_value());
  CHECK(launcher.signalsTo(pidOf(0)).empty());
  launcher.exit(*supervisor, pidOf(0), exitedWith(0));
  launcher.exit(*supervisor, pidOf(1), exitedWith(0));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  CHECK(outcome->kind == JobOutcome::Kind::kSucceeded);
}

TEST_CASE_METHOD(Fixture,
                 "a worker SIGKILL does not end is given up on at the reap bound: exit 7, named",
                 "[unit]") {
  SupervisorOptions options;
  options.max_restarts = 2;
  options.shutdown_timeout = 100ms;
  options.reap_timeout = 200ms;
  make(options);
  launcher.states[pidOf(0)] = 'D';  // never exits: SIGTERM and SIGKILL reach nothing
  const auto began = std::chrono::steady_clock::now();
  launcher.exit(*supervisor, pidOf(1), exitedWith(3));
  REQUIRE(runUntil([&] { return outcome.has_value(); }));
  const auto took = std::chrono::steady_clock::now() - began;
  CHECK(took >= 300ms);
  CHECK(took < 3s);  // the drain does not wait for its pipes: they were closed
  CHECK(outcome->kind == JobOutcome::Kind::kUnreaped);
  CHECK(outcome->exitCode() == 7);
  CHECK(std::string(jobOutcomeName(outcome->kind)) == "unreaped");
  CHECK(attempts_prepared == std::vector<int>{0});
  const auto sent = launcher.signalsTo(pidOf(0));
  CHECK(std::count(sent.begin(), sent.end(), SIGKILL) >= 1);
  REQUIRE(outcome->failures.size() == 2);
  const WorkerFailure& root = outcome->failures[rootCauseIndex(outcome->failures)];
  CHECK(root.rank == 1);  // the failure that started it, not the stuck one
  const WorkerFailure& stuck =
      outcome->failures[0].rank == 0 ? outcome->failures[0] : outcome->failures[1];
  CHECK(stuck.unreaped);
  CHECK(stuck.teardown);
  CHECK(stuck.pid == pidOf(0));
  CHECK(stuck.message.find("after SIGKILL") != std::string::npos);
  const std::string report = formatFailureReport("worker", "host", outcome->failures);
  CHECK(report.find("<not reaped> (pid: " + std::to_string(pidOf(0))) != std::string::npos);
}
