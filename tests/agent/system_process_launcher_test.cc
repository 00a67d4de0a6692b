// The real ProcessLauncher on real children: every guarantee of process_launcher.h is read back
// from inside the started process (cpprun_launcher_probe reports its own process group, parent-
// death signal, signal masks, descriptors, CPU affinity and memory policy). Every wait is bounded
// (a pidfd polled with a deadline); every process a test starts is ended and reaped by it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/console/worker_terminal.h"
#include "agent/processes/process_launcher.h"
#include "agent/processes/warm_start_launcher.h"
#include "common/asio.h"
#include "tests/support/test_support.h"

#ifndef CPPRUN_LAUNCHER_PROBE
#error "CPPRUN_LAUNCHER_PROBE must name the cpprun_launcher_probe binary"
#endif

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using cpprun::testing::TempDir;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kBound = 20s;

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Reads `fd` until EOF, or until `until` is in the text when given; "" plus FAIL on timeout.
std::string readUntil(int fd, Clock::time_point deadline, const std::string& until = "") {
  std::string text;
  for (;;) {
    if (!until.empty() && text.find(until) != std::string::npos) return text;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, msLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      FAIL("no output from the probe in time; so far: " << text);
      return text;
    }
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return text;
    text.append(buf, static_cast<size_t>(n));
  }
}

// Waits (bounded) for `pid` to exit and reaps it: its wait status, or nullopt after SIGKILLing
// it at the deadline. `pid` must be a child of this process.
std::optional<int> waitExit(pid_t pid, Clock::time_point deadline) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  bool exited = true;
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int ready;
    while ((ready = ::poll(&p, 1, msLeft(deadline))) < 0 && errno == EINTR) {
    }
    exited = ready > 0;
    ::close(pidfd);
  }
  if (!exited) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!exited) return std::nullopt;
  return status;
}

std::map<std::string, std::string> parseProbe(const std::string& text) {
  std::map<std::string, std::string> values;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return values;
}

struct ProbeRun {
  Result<pid_t> pid = internalError("not run");
  std::map<std::string, std::string> report;
  std::optional<int> status;
};

// Spawns the probe through `launcher` with `spec` (argv and stdout are filled in) and collects
// its report and its exit.
ProbeRun runProbe(ProcessLauncher& launcher, ProcessSpec spec,
                  const std::vector<std::string>& names = {}) {
  ProbeRun run;
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  if (spec.argv.empty()) spec.argv = {CPPRUN_LAUNCHER_PROBE};
  for (const auto& n : names) spec.argv.push_back(n);
  spec.stdout_fd = out[1];
  run.pid = launcher.spawn(spec);
  ::close(out[1]);
  if (run.pid.isOk()) {
    const auto deadline = Clock::now() + kBound;
    run.report = parseProbe(readUntil(out[0], deadline));
    run.status = waitExit(run.pid.value(), deadline);
  }
  ::close(out[0]);
  return run;
}

// A /proc/self/status hex mask as bits (bit n-1: signal n).
uint64_t mask(const std::string& hex) { return std::stoull(hex, nullptr, 16); }
bool hasSignal(uint64_t bits, int signo) { return (bits >> (signo - 1)) & 1U; }

std::string ownStatusField(const std::string& name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + ":") == 0) {
      return line.substr(line.find_first_not_of(" \t", name.size() + 1));
    }
  }
  return "";
}

// This thread's own CPUs, highest last.
std::vector<int> ownCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// The first memory node this process may use (Mems_allowed_list: "0" or "0-1" ...).
int firstMemoryNode() {
  const std::string mems = ownStatusField("Mems_allowed_list");
  REQUIRE_FALSE(mems.empty());
  return std::atoi(mems.c_str());
}

bool noChildren() { return childrenOf(::getpid()).empty(); }

// Restores this thread's signal state when a test is done with it.
class SignalStateGuard {
 public:
  SignalStateGuard() {
    ::pthread_sigmask(SIG_SETMASK, nullptr, &mask_);
    for (int s : kSignals) ::sigaction(s, nullptr, &actions_[s]);
  }
  ~SignalStateGuard() {
    for (int s : kSignals) ::sigaction(s, &actions_[s], nullptr);
    ::pthread_sigmask(SIG_SETMASK, &mask_, nullptr);
  }

 private:
  static constexpr int kSignals[] = {SIGHUP, SIGPIPE, SIGUSR1, SIGUSR2, SIGTERM};
  sigset_t mask_;
  struct sigaction actions_[NSIG];
};

void noteSignal(int) {}

TEST_CASE("a worker leads its own process group with stdin /dev/null and nothing else inherited",
          "[unit][launcher]") {
  auto launcher = makeSystemProcessLauncher();
  // Descriptors without close-on-exec, which fork + exec alone would hand down.
  int leaky_pipe[2];
  REQUIRE(::pipe(leaky_pipe) == 0);
  const int leaky_file = ::open("/dev/null", O_RDONLY);
  const int leaky_socket = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(leaky_file >= 0);
  REQUIRE(leaky_socket >= 0);

  ProbeRun run = runProbe(*launcher, {});
  ::close(leaky_pipe[0]);
  ::close(leaky_pipe[1]);
  ::close(leaky_file);
  ::close(leaky_socket);

  REQUIRE(run.pid.isOk());
  REQUIRE(run.status.has_value());
  CHECK(WIFEXITED(*run.status));
  CHECK(WEXITSTATUS(*run.status) == 0);
  REQUIRE(run.report.count("end") == 1);
  const std::string pid = std::to_string(run.pid.value());
  CHECK(run.report["pid"] == pid);
  CHECK(run.report["pgid"] == pid);  // the returned pid is the group id signalGroup takes
  CHECK(run.report["ppid"] == std::to_string(::getpid()));
  CHECK(run.report["pdeathsig"] == std::to_string(SIGKILL));
  CHECK(run.report["stdin"] == "/dev/null");
  CHECK(run.report["fds"] == "");
}

TEST_CASE("a worker given a terminal leads a session with it as controlling terminal",
          "[unit][launcher]") {
  auto launcher = makeSystemProcessLauncher();
  auto pty = openWorkerPty(std::nullopt);
  REQUIRE(pty.isOk());
  ProcessSpec spec;
  spec.stdin_fd = pty.value().slave;
  spec.controlling_tty_fd = pty.value().slave;
  ProbeRun run = runProbe(*launcher, spec);
  ::close(pty.value().slave);
  ::close(pty.value().master);
  REQUIRE(run.pid.isOk());
  REQUIRE(run.report.count("end") == 1);
  const std::string pid = std::to_string(run.pid.value());
  CHECK(run.report["pgid"] == pid);  // still the group signalGroup takes
  CHECK(run.report["sid"] == pid);
  CHECK(run.report["stdin"].rfind("/dev/pts/", 0) == 0);
  CHECK(run.report["stdin_foreground"] == pid);  // its group is the terminal's foreground
  CHECK(run.report["fds"] == "");
}

TEST_CASE("a worker starts with an empty signal mask and default dispositions",
          "[unit][launcher]") {
  SignalStateGuard restore;
  // The agent's state at spawn: SIGPIPE ignored (its own choice), SIGHUP ignored (its caller's,
  // as nohup does), handlers installed, signals blocked in the spawning thread.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = noteSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR2);
  sigaddset(&blocked, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &blocked, nullptr);

  auto launcher = makeSystemProcessLauncher();
  // The kernel's view right after exec, read by a program that installs no handler of its own
  // (sed): the probe may be built with a sanitizer whose runtime catches SIGSEGV, SIGBUS and
  // SIGFPE before main.
  ProcessSpec spec;
  spec.argv = {"/bin/sed",
               "-n",
               "-e",
               "s/^SigBlk:\\s*/sigblk=/p",
               "-e",
               "s/^SigIgn:\\s*/sigign=/p",
               "-e",
               "s/^SigCgt:\\s*/sigcgt=/p",
               "-e",
               "$ s/.*/end=1/p",
               "/proc/self/status"};
  ProbeRun run = runProbe(*launcher, spec);
  REQUIRE(run.pid.isOk());
  REQUIRE(run.status.has_value());
  REQUIRE(run.report.count("end") == 1);
  CHECK(mask(run.report["sigblk"]) == 0);
  const uint64_t ignored = mask(run.report["sigign"]);
  CHECK_FALSE(hasSignal(ignored, SIGPIPE));
  CHECK(hasSignal(ignored, SIGHUP));
  CHECK_FALSE(hasSignal(ignored, SIGUSR1));
  CHECK_FALSE(hasSignal(ignored, SIGTERM));
  CHECK(mask(run.report["sigcgt"]) == 0);
}

TEST_CASE(
    "the program is looked up in the worker's PATH and its environment is the agent's plus the "
    "spec's",
    "[unit][launcher]") {
  std::string probe = CPPRUN_LAUNCHER_PROBE;
  const std::string dir = probe.substr(0, probe.rfind('/'));
  const std::string name = probe.substr(probe.rfind('/') + 1);
  REQUIRE(::setenv("CPPRUN_PROBE_INHERITED", "from-the-agent", 1) == 0);
  REQUIRE(::setenv("CPPRUN_PROBE_REPLACED", "old", 1) == 0);
  auto launcher = makeSystemProcessLauncher();
  ProcessSpec spec;
  spec.argv = {name};
  spec.env = {{"PATH", "/nonexistent-dir:" + dir}, {"CPPRUN_PROBE_REPLACED", "new"}};
  ProbeRun run =
      runProbe(*launcher, spec, {"CPPRUN_PROBE_INHERITED", "CPPRUN_PROBE_REPLACED", "PATH"});
  ::unsetenv("CPPRUN_PROBE_INHERITED");
  ::unsetenv("CPPRUN_PROBE_REPLACED");
  REQUIRE(run.pid.isOk());
  REQUIRE(run.status.has_value());
  CHECK(run.report["env.CPPRUN_PROBE_INHERITED"] == "from-the-agent");
  CHECK(run.report["env.CPPRUN_PROBE_REPLACED"] == "new");
  CHECK(run.report["env.PATH"] == "/nonexistent-dir:" + dir);
}

TEST_CASE(
    "a program that cannot be executed fails the spawn naming it and errno and leaves no child",
    "[unit][launcher]") {
  auto launcher = makeSystemProcessLauncher();
  TempDir dir;
  REQUIRE(noChildren());

  ProcessSpec missing;
  missing.argv = {dir.path() + "/no-such-program"};
  auto r = launcher->spawn(missing);
  REQUIRE_FALSE(r.isOk());
  CHECK_THAT(r.status().message(),
             Catch::Contains("'" + dir.path() + "/no-such-program'") &&
                 Catch::Contains("execve(" + dir.path() + "/no-such-program): ") &&
                 Catch::Contains("ENOENT"));
  CHECK(noChildren());

  const std::string not_executable = dir.path() + "/data.txt";
  std::ofstream(not_executable) << "not a program\n";
  REQUIRE(::chmod(not_executable.c_str(), 0644) == 0);
  ProcessSpec denied;
  denied.argv = {not_executable, "arg"};
  r = launcher->spawn(denied);
  REQUIRE_FALSE(r.isOk());
  CHECK_THAT(r.status().message(),
             Catch::Contains("'" + not_executable + "'") && Catch::Contains("EACCES"));
  CHECK(noChildren());

  ProcessSpec not_in_path;
  not_in_path.argv = {"cpprun-no-such-program-anywhere"};
  r = launcher->spawn(not_in_path);
  REQUIRE_FALSE(r.isOk());
  CHECK_THAT(r.status().message(), Catch::Contains("'cpprun-no-such-program-anywhere'") &&
                                       Catch::Contains("not found in PATH"));

  ProcessSpec nothing;
  r = launcher->spawn(nothing);
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(noChildren());
}

TEST_CASE("a child step that fails names its syscall and errno and leaves no child",
          "[unit][launcher]") {
  TempDir dir;
  REQUIRE(noChildren());
  ProcessSpec spec;
  spec.argv = {"/bin/true"};

  SECTION("a controlling terminal that is not a terminal") {
    int pipe_fds[2];
    REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    spec.controlling_tty_fd = pipe_fds[0];
    auto r = makeSystemProcessLauncher()->spawn(spec);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(),
               Catch::Contains("ioctl(" + std::to_string(pipe_fds[0]) + ", TIOCSCTTY): ") &&
                   Catch::Contains("ENOTTY"));
  }
  SECTION("a job cgroup that does not exist") {
    WorkerContainment containment;
    containment.cgroup_procs = dir.path() + "/no-cgroup/cgroup.procs";
    auto r = makeSystemProcessLauncher(containment)->spawn(spec);
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(
        r.status().message(),
        Catch::Contains("openat(" + containment.cgroup_procs + "): ") && Catch::Contains("ENOENT"));
  }
  SECTION("a stdout descriptor that is not open") {
    spec.stdout_fd = 1000;
    auto r = makeSystemProcessLauncher()->spawn(spec);
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(),
               Catch::Contains("stdout: dup3(1000, 1): ") && Catch::Contains("EBADF"));
  }
  CHECK(noChildren());
}

TEST_CASE("a worker runs with the CPU affinity and memory policy of its spec", "[unit][launcher]") {
  auto launcher = makeSystemProcessLauncher();
  const std::vector<int> own = ownCpus();
  REQUIRE_FALSE(own.empty());
  const int node = firstMemoryNode();

  SECTION("none asked: inherited") {
    ProbeRun run = runProbe(*launcher, {});
    REQUIRE(run.status.has_value());
    CHECK(run.report["cpus"] == ownStatusField("Cpus_allowed_list"));
    CHECK(run.report["mempolicy"] == "default");
  }
  SECTION("one CPU and MPOL_BIND") {
    ProcessSpec spec;
    spec.cpus = {own.back()};
    spec.memory_policy = ProcessSpec::MemoryPolicy::kBind;
    spec.memory_nodes = {node};
    ProbeRun run = runProbe(*launcher, spec);
    REQUIRE(run.pid.isOk());
    REQUIRE(run.status.has_value());
    CHECK(run.report["cpus"] == std::to_string(own.back()));
    CHECK(run.report["mempolicy"] == "bind:" + std::to_string(node));
  }
  SECTION("every CPU and MPOL_PREFERRED") {
    ProcessSpec spec;
    spec.cpus = own;
    spec.memory_policy = ProcessSpec::MemoryPolicy::kPreferred;
    spec.memory_nodes = {node};
    ProbeRun run = runProbe(*launcher, spec);
    REQUIRE(run.pid.isOk());
    REQUIRE(run.status.has_value());
    CHECK(run.report["cpus"] == ownStatusField("Cpus_allowed_list"));
    CHECK(run.report["mempolicy"] == "preferred:" + std::to_string(node));
  }
  SECTION("nodes without a policy, or a policy without nodes: inherited") {
    ProcessSpec spec;
    spec.memory_nodes = {node};
    ProbeRun run = runProbe(*launcher, spec);
    REQUIRE(run.status.has_value());
    CHECK(run.report["mempolicy"] == "default");
    spec.memory_nodes.clear();
    spec.memory_policy = ProcessSpec::MemoryPolicy::kBind;
    run = runProbe(*launcher, spec);
    REQUIRE(run.status.has_value());
    CHECK(run.report["mempolicy"] == "default");
  }
}

// --warm-restart (warm_start_launcher.h): a worker the warm process forks is set up as a cold
// one. The program it runs execs the probe, which keeps what the fork set up (process group,
// parent-death signal, affinity, memory policy, descriptors, environment) and reports it.
TEST_CASE(
    "warm start: a worker the warm process forks has its spec's CPUs, memory policy, process "
    "group, parent-death signal, stdin and environment, and is the spawner's child",
    "[unit][launcher]") {
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);  // as the agent is
  const std::vector<int> own = ownCpus();
  const int node = firstMemoryNode();
  TempDir dir;
  const std::string program = dir.path() + "/exec_probe.py";
  std::ofstream(program) << "import os, sys\nos.execv(sys.argv[1], sys.argv[1:])\n";
  {
    boost::asio::io_context io;
    WarmStartOptions options;
    options.module_dir = dir.path() + "/python";
    options.spare_like.argv = {"/usr/bin/python3", "-u", program};
    bool ready = false;
    WarmStartLauncher launcher(io, makeSystemProcessLauncher(), options,
                               [&](const std::vector<std::string>&) { ready = true; });
    launcher.prewarm({"json", "decimal"});  // as a hot spare does
    REQUIRE(launcher.warmPid() > 0);
    const auto deadline = Clock::now() + kBound;
    while (!ready && Clock::now() < deadline) io.run_one_for(std::chrono::milliseconds(100));
    REQUIRE(ready);

    ProcessSpec spec;
    spec.argv = {"/usr/bin/python3", "-u", program, CPPRUN_LAUNCHER_PROBE};
    spec.env = {{"CPPRUN_TEST_VALUE", "42"}};
    spec.cpus = {own.back()};
    spec.memory_policy = ProcessSpec::MemoryPolicy::kPreferred;
    spec.memory_nodes = {node};
    ProbeRun warm = runProbe(launcher, spec, {"CPPRUN_TEST_VALUE"});
    REQUIRE(warm.pid.isOk());
    REQUIRE(warm.status.has_value());
    CHECK(WIFEXITED(*warm.status));
    CHECK(WEXITSTATUS(*warm.status) == 0);
    // The same spec started cold: the report is the same but for the pid.
    auto cold_launcher = makeSystemProcessLauncher();
    ProbeRun cold = runProbe(*cold_launcher, spec, {"CPPRUN_TEST_VALUE"});
    REQUIRE(cold.status.has_value());
    CHECK(warm.report["pgid"] == warm.report["pid"]);  // its own process group
    CHECK(warm.report["pid"] == std::to_string(warm.pid.value()));
    for (auto* report : {&warm.report, &cold.report}) {
      for (const char* per_process : {"pid", "pgid", "sid"}) report->erase(per_process);
    }
    CHECK(warm.report == cold.report);
    // And outright, so that both losing one cannot pass.
    CHECK(warm.report["ppid"] == std::to_string(::getpid()));
    CHECK(warm.report["pdeathsig"] == std::to_string(SIGKILL));
    CHECK(warm.report["stdin"] == "/dev/null");
    CHECK(warm.report["fds"].empty());
    CHECK(warm.report["cpus"] == std::to_string(own.back()));
    CHECK(warm.report["mempolicy"] == "preferred:" + std::to_string(node));
    CHECK(warm.report["env.CPPRUN_TEST_VALUE"] == "42");
  }  // the launcher kills and reaps its warm process
  CHECK(noChildren());
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_CASE("a binding that cannot be applied fails the spawn naming the CPUs or nodes and errno",
          "[unit][launcher]") {
  auto launcher = makeSystemProcessLauncher();
  REQUIRE(noChildren());
  ProcessSpec spec;
  spec.argv = {CPPRUN_LAUNCHER_PROBE};

  SECTION("CPUs the machine does not have") {
    REQUIRE(::sysconf(_SC_NPROCESSORS_CONF) < 4000);
    spec.cpus = {4000, 4001, 4002};
    auto r = launcher->spawn(spec);
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(r.status().message(), Catch::Contains("CPUs 4000-4002") &&
                                         Catch::Contains("sched_setaffinity") &&
                                         Catch::Contains("EINVAL"));
  }
  SECTION("a NUMA node the machine does not have") {
    struct stat st;
    REQUIRE(::stat("/sys/devices/system/node/node60", &st) != 0);
    spec.memory_policy = ProcessSpec::MemoryPolicy::kBind;
    spec.memory_nodes = {60};
    auto r = launcher->spawn(spec);
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(r.status().message(), Catch::Contains("bind on NUMA nodes 60") &&
                                         Catch::Contains("set_mempolicy") &&
                                         Catch::Contains("EINVAL"));
  }
  SECTION("numbers no machine has") {
    spec.cpus = {-1};
    auto r = launcher->spawn(spec);
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("CPU -1"));
    spec.cpus.clear();
    spec.memory_policy = ProcessSpec::MemoryPolicy::kPreferred;
    spec.memory_nodes = {0, 1 << 20};
    r = launcher->spawn(spec);
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("NUMA node 1048576"));
  }
  CHECK(noChildren());
}

TEST_CASE("a worker is killed when the process that spawned it dies", "[unit][launcher]") {
  // The test becomes the workers' subreaper, so it can reap the worker and see how it died.
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  int report[2];
  REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
  const pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    // The stand-in agent: spawn a probe that holds, then wait to be killed.
    auto launcher = makeSystemProcessLauncher();
    ProcessSpec spec;
    spec.argv = {CPPRUN_LAUNCHER_PROBE, "--hold"};
    spec.stdout_fd = report[1];
    if (!launcher->spawn(spec).isOk()) ::_exit(3);
    for (;;) ::pause();
  }
  ::close(report[1]);
  const auto deadline = Clock::now() + kBound;
  auto values = parseProbe(readUntil(report[0], deadline, "end=1\n"));
  ::close(report[0]);
  REQUIRE(values.count("pid") == 1);
  const pid_t worker = static_cast<pid_t>(std::stol(values["pid"]));
  CHECK(values["ppid"] == std::to_string(agent));

  REQUIRE(::kill(agent, SIGKILL) == 0);
  auto agent_status = waitExit(agent, deadline);
  REQUIRE(agent_status.has_value());
  // The worker is re-parented to this process and must die of the parent-death signal.
  auto worker_status = waitExit(worker, deadline);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  REQUIRE(worker_status.has_value());
  CHECK(WIFSIGNALED(*worker_status));
  CHECK(WTERMSIG(*worker_status) == SIGKILL);
}

TEST_CASE("the parent-death signal follows the thread that spawned the worker",
          "[unit][launcher]") {
  // Documented in process_launcher.h: the agent spawns from its loop thread, which lives as long
  // as the job; a worker spawned from a thread that ends gets SIGKILL.
  auto launcher = makeSystemProcessLauncher();
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  Result<pid_t> pid = internalError("not run");
  std::thread spawner([&] {
    ProcessSpec spec;
    spec.argv = {CPPRUN_LAUNCHER_PROBE, "--hold"};
    spec.stdout_fd = out[1];
    pid = launcher->spawn(spec);
  });
  spawner.join();
  ::close(out[1]);
  ::close(out[0]);
  REQUIRE(pid.isOk());
  auto status = waitExit(pid.value(), Clock::now() + kBound);
  REQUIRE(status.has_value());
  CHECK(WIFSIGNALED(*status));
  CHECK(WTERMSIG(*status) == SIGKILL);
}

TEST_CASE("signalGroup reaches every process of a worker's group", "[unit][launcher]") {
  auto launcher = makeSystemProcessLauncher();
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", CPPRUN_LAUNCHER_PROBE " --hold & echo started; wait"};
  spec.stdout_fd = out[1];
  auto pid = launcher->spawn(spec);
  ::close(out[1]);
  REQUIRE(pid.isOk());
  const auto deadline = Clock::now() + kBound;
  auto text = readUntil(out[0], deadline, "end=1\n");
  ::close(out[0]);
  auto values = parseProbe(text);
  REQUIRE(values.count("pgid") == 1);
  CHECK(values["pgid"] == std::to_string(pid.value()));  // the grandchild is in the group too
  REQUIRE(launcher->signalGroup(pid.value(), SIGTERM).isOk());
  auto status = waitExit(pid.value(), deadline);
  REQUIRE(status.has_value());
  CHECK(WIFSIGNALED(*status));
  // The grandchild was re-parented to init (or a subreaper) and got SIGTERM with the group.
  const pid_t grandchild = static_cast<pid_t>(std::stol(values["pid"]));
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, grandchild, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    CHECK(::poll(&p, 1, msLeft(deadline)) == 1);
    ::close(pidfd);
  } else {
    CHECK(errno == ESRCH);  // already gone
  }
}

}  // namespace
