// cpprun never loses control of its job (issue 22): whatever signal reaches its processes,
// whatever a worker does to its process group, however cpprun itself dies, cpprun's exit means
// every process it started is gone. End to end: the real binary, real workers, real signals;
// synchronised through relayed output lines and exits, every wait bounded.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/processes/job_containment.h"
#include "agent/processes/process_launcher.h"
#include "rendezvous/tcp_store_client.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The agent: the guardian's (cpprun's) one child.
pid_t agentOf(const ChildProcess& run) {
  std::vector<pid_t> children = cpprun::agent::childrenOf(run.pid());
  REQUIRE(children.size() == 1);
  return children[0];
}

double millisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Polls (10 ms) until `path` exists, at most `bound`.
bool fileAppears(const std::string& path, std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  while (!fs::exists(path)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// cpprun with its stdout and stderr on a pipe the test reads only when it wants to: a console
// whose reader has stopped (a paused `less`, `| (sleep 20; cat)`, a terminal on hold).
class HeldConsoleRun {
 public:
  explicit HeldConsoleRun(const std::vector<std::string>& argv,
                          const std::vector<std::string>& extra_env = {},
                          bool own_process_group = false) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    read_fd_ = fds[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    if (own_process_group) {
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attr, 0);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_strings = extra_env;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    std::vector<char*> env;
    for (std::string& e : env_strings) env.push_back(e.data());
    env.push_back(nullptr);
    REQUIRE(::posix_spawn(&pid_, args[0], &actions, &attr, args.data(), env.data()) == 0);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(fds[1]);
  }
  ~HeldConsoleRun() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      drain(0ms);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(read_fd_);
  }
  pid_t pid() const { return pid_; }
  // Reads what is there; with a bound, until EOF or the bound.
  void drain(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    char buf[65536];
    for (;;) {
      pollfd p{read_fd_, POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<long>(0, left.count()))) <= 0) return;
      ssize_t n = ::read(read_fd_, buf, sizeof buf);
      if (n <= 0) return;
      output_.append(buf, static_cast<size_t>(n));
    }
  }
  // Reads (keeping the console flowing) until `text` is in the output, at most `bound`.
  bool readUntil(const std::string& text, std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (output_.find(text) == std::string::npos) {
      if (Clock::now() > deadline) return false;
      drain(50ms);
    }
    return true;
  }
  // The exit status, reading the console meanwhile; nullopt past the bound.
  std::optional<int> wait(std::chrono::milliseconds bound, bool read_console) {
    const auto deadline = Clock::now() + bound;
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        drain(1s);
        return status;
      }
      if (Clock::now() > deadline) return std::nullopt;
      if (read_console) {
        drain(10ms);
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
  }
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
  std::optional<int> status_;
  std::string output_;
};

}  // namespace

TEST_CASE("a signal outside --signals-to-handle ends neither cpprun nor its agent",
          "[integration]") {
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", kWorker, "print", "ready {rank}", "sleep-forever"}));
  REQUIRE(relayed(run, "[default0]:ready 0"));
  REQUIRE(relayed(run, "[default1]:ready 1"));
  const pid_t agent = agentOf(run);
  std::vector<pid_t> everything = cpprun::agent::descendantsOf(run.pid());
  REQUIRE(everything.size() == 3);  // the agent and two workers

  // To cpprun (passed on to the agent) and to the agent directly, as `pkill -USR2 cpprun` would.
  REQUIRE(::kill(run.pid(), SIGUSR1) == 0);
  REQUIRE(::kill(agent, SIGUSR2) == 0);
  REQUIRE(::kill(run.pid(), SIGALRM) == 0);
  REQUIRE(::kill(agent, SIGRTMIN + 3) == 0);
  for (const char* name : {"SIGUSR1", "SIGUSR2", "SIGALRM", "SIGRTMIN+3"}) {
    INFO(name << "\n" << run.output());
    REQUIRE(run.waitForText("received " + std::string(name) + ", which is not in", 30s));
  }
  // Every signal was dealt with; cpprun, its agent and the workers all run on.
  for (pid_t p : everything) CHECK(alive(p));
  CHECK(alive(run.pid()));

  const auto stop = Clock::now();
  run.signal(SIGTERM);
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 128 + SIGTERM);
  CHECK(allGone(everything, 1s));  // already gone when cpprun exits
  WARN("SIGTERM to cpprun's exit with every worker gone: " << millisecondsSince(stop) << " ms");
}

TEST_CASE("SIGUSR1 in --signals-to-handle reaches the workers and ends the job with them gone",
          "[integration]") {
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--signals-to-handle=SIGTERM,SIGUSR1",
                                  kWorker, "print", "ready {rank}", "sleep-forever"}));
  REQUIRE(relayed(run, "[default0]:ready 0"));
  REQUIRE(relayed(run, "[default1]:ready 1"));
  std::vector<pid_t> everything = cpprun::agent::descendantsOf(run.pid());
  const auto sent = Clock::now();
  run.signal(SIGUSR1);
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  const double took_ms = millisecondsSince(sent);
  INFO(run.output());
  // Forwarded as itself: it ends the workers (their default action), then the job.
  CHECK(exitCodeOf(*status) == 128 + SIGUSR1);
  for (pid_t p : everything) CHECK_FALSE(alive(p));
  WARN("SIGUSR1 to cpprun's exit with every worker gone: " << took_ms << " ms");
}

TEST_CASE("a worker that moves into another process group is still stopped and killed",
          "[integration]") {
  TempDir dir;
  const std::string d = dir.path();
  // Rank 0 leaves its group and ignores SIGTERM (only SIGKILL by pid can end it); rank 1 leaves
  // its group and stops on SIGTERM.
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--shutdown-timeout=1", kWorker,
                                  "leave-group", "exit-if-rank", "1", "0", "ignore", "TERM",
                                  "print", "ready {rank}", "sleep-forever"}));
  REQUIRE(relayed(run, "[default0]:ready 0"));
  std::vector<pid_t> everything = cpprun::agent::descendantsOf(run.pid());
  const auto sent = Clock::now();
  run.signal(SIGTERM);
  auto status = run.wait(20s);
  INFO(run.output());
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 128 + SIGTERM);
  CHECK(millisecondsSince(sent) < 10000);  // the 1 s grace, then SIGKILL by pid
  for (pid_t p : everything) CHECK_FALSE(alive(p));
}

TEST_CASE("a worker that left its group dies with the agent when cpprun is SIGKILLed",
          "[integration]") {
  TempDir dir;
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=1", "--shutdown-timeout=1", kWorker, "leave-group", "ignore",
                     "TERM", "print", "ready {rank}", "sleep-forever"}));
  REQUIRE(relayed(run, "[default0]:ready 0"));
  std::vector<pid_t> everything = cpprun::agent::descendantsOf(run.pid());
  REQUIRE(everything.size() == 2);
  run.signal(SIGKILL);
  REQUIRE(run.wait(10s).has_value());
  // The agent gets SIGTERM as its parent-death signal and tears the worker down by pid.
  CHECK(allGone(everything, 15s));
}

TEST_CASE("a storm of SIGTERMs during start leaves no process and no run directory",
          "[integration]") {
  // SIGTERM at every moment of the start: before the guardian exists, while it makes the run
  // directory, before the agent's loop catches signals, while workers start. Whenever it lands,
  // cpprun ends 128+SIGTERM and nothing it started outlives it.
  TempDir tmp;
  for (int round = 0; round < 12; ++round) {
    TempDir dir;
    ChildProcess run(cpprunCommand({"--nproc-per-node=2", kWorker, "fork-grandchildren", "1",
                                    dir.path() + "/gc-{rank}", "sleep-forever"}),
                     {{"TMPDIR", tmp.path()}});
    // Not before the exec: until then the child is a copy of this test program.
    const auto exec_deadline = Clock::now() + 10s;
    std::error_code ec;
    while (fs::read_symlink("/proc/" + std::to_string(run.pid()) + "/exe", ec) !=
               fs::path(CPPRUN_BINARY) &&
           Clock::now() < exec_deadline) {
    }
    // A different moment each round: spin 0, 0.25, 0.5, ... ms of CPU before the first one.
    const auto first = Clock::now() + std::chrono::microseconds(250 * round);
    while (Clock::now() < first) {
    }
    for (int i = 0; i < 20; ++i) ::kill(run.pid(), SIGTERM);
    auto status = run.wait(30s);
    INFO("round " << round << "\n" << run.output());
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 128 + SIGTERM);
    CHECK(processesMentioning(dir.path()).empty());
  }
  CHECK(fs::is_empty(tmp.path()));
}

TEST_CASE("a console that stops reading freezes neither the workers nor the agent",
          "[integration]") {
  TempDir dir;
  const std::string d = dir.path();
  // 2 x 2 MB of output into a 64 KiB pipe nobody reads; then each worker says it got through.
  // (The store's port, the kernel's pick, comes from the workers' environment.)
  HeldConsoleRun run(
      cpprunCommand({"--nproc-per-node=2", kWorker, "env-json", d + "/env-{rank}", "flood", "20000",
                     "100", "touch", d + "/flooded-{rank}", "sleep-forever"}));
  // Before the fix the agent wrote the console on its loop: the workers blocked in write(2).
  const bool flooded = fileAppears(d + "/flooded-0", 30s) && fileAppears(d + "/flooded-1", 30s);
  if (!flooded) run.drain(1s);  // what cpprun said, for the failure message
  INFO(run.output().substr(0, 4000));
  REQUIRE(flooded);
  // The agent's store answers while the console is held.
  const int port = std::stoi(readJson(d + "/env-0")["MASTER_PORT"].get<std::string>());
  cpprun::rendezvous::TcpStoreClientOptions options;
  options.port = static_cast<uint16_t>(port);
  options.connect_timeout = 5s;
  options.timeout = 5s;
  const auto asked = Clock::now();
  cpprun::rendezvous::TcpStoreClient client(options);
  client.set("console-test", bytesOf("ok"));
  CHECK(client.get("console-test") == bytesOf("ok"));
  CHECK(millisecondsSince(asked) < 2000);
  std::vector<pid_t> everything = cpprun::agent::descendantsOf(run.pid());
  // A SIGTERM is acted on at once: the workers are gone before the console gives anything back,
  // and cpprun ends within the 2 s it waits for a held console after a signal.
  const auto stop = Clock::now();
  REQUIRE(::kill(run.pid(), SIGTERM) == 0);
  CHECK(allGone({everything.begin() + 1, everything.end()}, 5s));
  auto status = run.wait(15s, /*read_console=*/false);
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 128 + SIGTERM);
  CHECK(millisecondsSince(stop) < 8000);
}

TEST_CASE("lines a held console missed are counted and announced, log files keep every one",
          "[integration]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string logs = d + "/logs";
  HeldConsoleRun run(
      cpprunCommand({"--nproc-per-node=2", "--log-dir", logs, "--rdzv-id", "held", "-t", "3",
                     kWorker, "flood", "20000", "100", "touch", d + "/flooded-{rank}", "wait-file",
                     d + "/go", "30", "print", "after {rank}"}));
  INFO(run.output().substr(0, 2000));
  REQUIRE(fileAppears(d + "/flooded-0", 30s));
  REQUIRE(fileAppears(d + "/flooded-1", 30s));
  // The reader comes back; the next line of each rank says how many it missed.
  run.drain(0ms);
  { std::ofstream(d + "/go").put('\n'); }
  REQUIRE(run.readUntil("[default0]:after 0", 30s));
  REQUIRE(run.readUntil("[default1]:after 1", 30s));
  auto status = run.wait(30s, /*read_console=*/true);
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 0);
  const std::string& out = run.output();
  const size_t notice = out.find("[default0]:[cpprun: ");
  REQUIRE(notice != std::string::npos);
  CHECK(notice < out.find("[default0]:after 0"));
  CHECK(out.find("line(s) not shown: the console did not keep up") != std::string::npos);
  CHECK(out.find("were not shown because the console did not keep up") != std::string::npos);
  // Every line is in the files.
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(runDirectoryOf(logs, "held") + "/attempt_0/" + std::to_string(rank) +
                     "/stdout.log");
    size_t lines = 0;
    std::string line;
    while (std::getline(in, line)) ++lines;
    CHECK(lines == 20001);  // the flood and "after"
  }
}

// kill -9 of cpprun's whole process group (`timeout -s KILL`, job tools): the guardian and the
// agent die together, the workers by their parent-death signal, and what they started is left
// to the job's sentinel and cgroup.
static void killWholeGroupLeavesNothing(const std::vector<std::string>& extra_env,
                                        bool with_cgroup) {
  TempDir dir;
  TempDir tmp;
  const std::string d = dir.path();
  std::vector<std::string> env = extra_env;
  env.push_back("TMPDIR=" + tmp.path());
  HeldConsoleRun run(cpprunCommand({"--nproc-per-node=2", kWorker, "fork-grandchildren", "2",
                                    d + "/gc-{rank}", "fork-daemon", d + "/daemon-{rank}", "touch",
                                    d + "/ready-{rank}", "sleep-forever"}),
                     env, /*own_process_group=*/true);
  REQUIRE(fileAppears(d + "/ready-0", 30s));
  REQUIRE(fileAppears(d + "/ready-1", 30s));
  std::vector<pid_t> grandchildren = pidsIn(d + "/gc-0");
  for (pid_t p : pidsIn(d + "/gc-1")) grandchildren.push_back(p);
  std::vector<pid_t> daemons = pidsIn(d + "/daemon-0");
  for (pid_t p : pidsIn(d + "/daemon-1")) daemons.push_back(p);
  REQUIRE(grandchildren.size() == 4);
  REQUIRE(daemons.size() == 2);
  // The job's cgroup exists while it runs exactly when one is wanted and this process may make
  // one (root here; a delegated subtree elsewhere).
  const std::string own = cpprun::agent::ownCgroupDir();
  const bool permitted = !own.empty() && ::access(own.c_str(), W_OK) == 0;
  const bool daemons_must_die = with_cgroup && permitted;
  if (!own.empty()) {
    CHECK(fs::exists(own + "/cpprun-" + std::to_string(run.pid())) == daemons_must_die);
  }
  std::vector<pid_t> everything;  // cpprun's tree but the daemons
  for (pid_t p : cpprun::agent::descendantsOf(run.pid())) {
    if (std::find(daemons.begin(), daemons.end(), p) == daemons.end()) everything.push_back(p);
  }
  REQUIRE(everything.size() == 7);  // agent, 2 workers, 4 grandchildren
  REQUIRE(::kill(-run.pid(), SIGKILL) == 0);
  REQUIRE(run.wait(10s, /*read_console=*/true).has_value());
  CHECK(allGone(everything, 15s));
  CHECK(allGone(grandchildren, 15s));
  if (daemons_must_die) {
    CHECK(allGone(daemons, 15s));
  } else {
    for (pid_t p : daemons) ::kill(p, SIGKILL);  // what the fallback cannot reach (documented)
  }
  // The sentinel removed the run's temporary directory.
  const auto deadline = Clock::now() + 15s;
  while (!fs::is_empty(tmp.path()) && Clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(fs::is_empty(tmp.path()));
  CHECK(allGone(processesMentioning(d), 15s));
}

TEST_CASE("kill -9 of cpprun's whole process group leaves no process and no run directory",
          "[integration]") {
  // Where cpprun may make a cgroup (root here), the job gets one of its own, so even the daemons
  // that left their groups die.
  killWholeGroupLeavesNothing({}, /*with_cgroup=*/true);
}

TEST_CASE("without a cgroup, kill -9 of cpprun's group still ends every worker's process group",
          "[integration]") {
  killWholeGroupLeavesNothing({"CPPRUN_JOB_CGROUP=off"}, /*with_cgroup=*/false);
}
