// launch_bench: the cpprun launcher against torch 2.x's torchrun and torch 1.13's elastic
// launcher, same workers, same run.
//
//   launch_bench [--runs N] [--nproc 1,2,4,8] [--figures floor,launch,failure,memory]
//                [--floor-nproc 1,8,32] [--timeout S] [--peers torchrun2,torch113]
//                [--torch-monitor-intervals 5,0.1] [--cpprun-baseline PATH]
//
// Peers:
//   torchrun2  the real `torchrun` CLI of the pinned torch 2.x (CPPRUN_TORCH2_PYTHON's venv),
//              with its default settings (monitor interval 0.1 s, static rendezvous, start
//              method spawn): `torchrun --no-python --nproc-per-node=N --max-restarts=K
//              --master-addr=127.0.0.1 --master-port=<free port> WORKER ... v2`. Its agent hosts
//              a libuv TCPStore, so the worker and this benchmark talk to it in the 2.2+ dialect.
//              This is the anchor: the unsuffixed RESULT lines compare with it.
//   torch113   torch.distributed.launcher.api.elastic_launch of Debian's torch 1.13 called as
//              its torchrun calls it (tests/bench/torch_elastic_launch.py under /usr/bin/python3:
//              static rendezvous, agent-hosted store at 127.0.0.1:<free port>, start_method
//              spawn), once per --torch-monitor-intervals (default 5 s, 1.13 torchrun's default,
//              and 0.1 s). Legacy dialect.
// cpprun runs `cpprun --no-python --nproc-per-node=N --master-addr=127.0.0.1
// --master-port=<free port> WORKER ...`. The worker is cpprun_bench_worker
// (tests/bench/bench_worker.cc). Launchers alternate: every repetition rotates the order of the
// variants.
//
// Figures:
//   floor     worker start at the machine's floor: wall time of `cpprun --nproc-per-node=N
//             --no-python /bin/true` (plus --master-addr=127.0.0.1 --master-port=<free port>)
//             against `/bin/sh -c` starting the same N /bin/true processes in the background
//             and waiting for them (the floor: fork + exec + reap, nothing else), against
//             `torchrun --no-python --nproc-per-node=N ... /bin/true` (torch 2.x, default
//             settings) and, with --cpprun-baseline, another cpprun build; for every
//             --floor-nproc. Alternating, same run.
//   launch    wall time from fork() of the launcher until it has exited (pidfd readable), with
//             a worker that connects to the store at MASTER_ADDR:MASTER_PORT, sets one key and
//             exits 0; for every --nproc.
//   failure   nproc 2, max_restarts 1: rank 1 records CLOCK_MONOTONIC and SIGKILLs itself once
//             rank 0 has its SIGTERM handler; "detect" = rank 0's SIGTERM-handler time minus
//             rank 1's death time; "restart" = the first start of an attempt-1 worker (top of
//             its main) minus rank 1's death time.
//   memory    nproc 8 (--memory-nproc): workers block on a store key; meanwhile VmHWM (peak RSS)
//             of every process in the launcher's tree that is not a worker (workers: /proc/<pid>/
//             exe is the bench worker) is summed; then the key is set and the launcher must exit.
//             cpprun: guardian + agent (both also shown); torch: the python process running
//             torchrun / elastic_launch plus any helper process (the whole tree minus workers).
//
// Prints a table (median (min) per variant and the number of good runs) and one line per figure
// and peer:
//   RESULT <name>[_t113_mi<S>] <cpprun median> <unit> peer=<peer median> ratio=<peer/cpprun>
// (times and memory: ratio > 1 means cpprun is better). Unsuffixed lines: peer = torchrun 2.x;
// `_t113_mi5`, `_t113_mi0.1`: torch 1.13 with that monitor_interval; `_vs_shell`: the shell of
// the floor figure; `_baseline`: the --cpprun-baseline build. Targets are printed as
// information; the exit status is 1 when a run failed (bad exit status, timeout, missing
// timestamps, processes left behind), 2 on a bad flag.
//
// Every wait is bounded: a launcher still running after --timeout is stopped (SIGTERM, 5 s, then
// SIGKILL to it and every process of its tree, by PID) and the run counts as failed. This
// process is a child subreaper, so processes a launcher leaves behind come back to it: they are
// reported, killed by PID and reaped after every run. SIGINT/SIGTERM stop the current launcher
// and end the benchmark through the same clean-up; temporary directories are removed.
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/command_line.h"
#include "common/system.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/wire.h"

#ifndef LAUNCH_BENCH_SOURCE_DIR
#error "LAUNCH_BENCH_SOURCE_DIR must name the source tree"
#endif
#ifndef LAUNCH_BENCH_CPPRUN
#error "LAUNCH_BENCH_CPPRUN must name the cpprun binary"
#endif
#ifndef LAUNCH_BENCH_WORKER
#error "LAUNCH_BENCH_WORKER must name the cpprun_bench_worker binary"
#endif
#ifndef CPPRUN_TORCH2_PYTHON
#error "CPPRUN_TORCH2_PYTHON must name the torch 2.x venv's python"
#endif
#ifndef CPPRUN_TORCH2_VERSION
#error "CPPRUN_TORCH2_VERSION must name the pinned torch 2.x version"
#endif

extern char** environ;

namespace {

using cpprun::rendezvous::TcpStoreClient;
using cpprun::rendezvous::TcpStoreClientOptions;
using cpprun::rendezvous::toBytes;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kPython = "/usr/bin/python3";  // Debian's torch 1.13
constexpr const char* kHost = "127.0.0.1";
constexpr double kTorchrunMonitorInterval = 5.0;  // torch/distributed/run.py, 1.13

// torchrun next to the torch 2.x venv's python.
std::string defaultTorchrun() {
  std::string python = CPPRUN_TORCH2_PYTHON;
  auto slash = python.rfind('/');
  return (slash == std::string::npos ? std::string() : python.substr(0, slash + 1)) + "torchrun";
}

std::string fmt(double v, int decimals);

// ------------------------------------------------------------------------------------------
// Flags

struct Options {
  int runs = 5;
  std::vector<int> nprocs{1, 2, 4, 8};
  std::vector<int> floor_nprocs{1, 8, 32};
  int memory_nproc = 8;
  std::set<std::string> figures{"floor", "launch", "failure", "memory"};
  double timeout_s = 120;
  std::vector<double> monitor_intervals{kTorchrunMonitorInterval, 0.1};
  bool torchrun2 = true;  // --peers
  bool torch113 = true;
  std::string torchrun = defaultTorchrun();
  std::string cpprun = LAUNCH_BENCH_CPPRUN;
  std::string cpprun_baseline;  // --cpprun-baseline: another build, in the floor and memory figures
  std::string worker = LAUNCH_BENCH_WORKER;
  std::string shim = std::string(LAUNCH_BENCH_SOURCE_DIR) + "/tests/bench/torch_elastic_launch.py";
  bool keep_going = true;
};

constexpr const char* kUsage = R"(Usage: launch_bench [options]

Benchmarks the cpprun launcher against torch 2.x's real torchrun CLI (default settings; the
anchor) and torch 1.13's elastic launcher (elastic_launch, called as torchrun calls it, by
tests/bench/torch_elastic_launch.py under /usr/bin/python3), with the same worker
(cpprun_bench_worker), alternating, in the same run.

Figures:
  floor     `cpprun --nproc-per-node=N --no-python /bin/true` against a shell starting the same
            N processes and waiting (the machine's floor) and torchrun 2.x doing the same (one
            row per --floor-nproc)
  launch    wall time from starting the launcher to its exit; the worker connects to the store
            at MASTER_ADDR:MASTER_PORT, sets one key and exits 0 (one row per --nproc)
  failure   nproc 2, max restarts 1: rank 1 SIGKILLs itself; time until rank 0's SIGTERM
            handler runs ("detect") and until the first worker of attempt 1 starts ("restart")
  memory    peak RSS (VmHWM) of the launcher's own processes (not the workers) while
            --memory-nproc workers are alive; cpprun: guardian + agent; torch: its python
            process and any helper process (the launcher's tree minus the workers)

Options:
  --runs N                       repetitions of every figure (default 5); medians reported
  --nproc LIST                   worker counts of the launch figure (default 1,2,4,8)
  --floor-nproc LIST             worker counts of the floor figure (default 1,8,32)
  --memory-nproc N               worker count of the memory figure (default 8)
  --figures LIST                 any of floor,launch,failure,memory (default: all four)
  --peers LIST                   any of torchrun2,torch113 (default: both)
  --torch-monitor-intervals LIST torch 1.13 variants by monitor_interval in seconds (default
                                 5,0.1; 5 is 1.13 torchrun's default)
  --torchrun PATH                torch 2.x's torchrun (default: next to CPPRUN_TORCH2_PYTHON)
  --timeout S                    bound of one launcher run, seconds (default 120); a launcher
                                 still running then is killed and the run counts as failed
  --cpprun PATH                  the cpprun binary (default: the one built with this benchmark)
  --cpprun-baseline PATH         another cpprun build (before a change) to run beside it in
                                 the floor and memory figures (RESULT lines `_baseline`)
  --worker PATH                  the bench worker (default: the one built with this benchmark)
  --help                         show this help and exit

Output: a table, then one line per figure and peer:
  RESULT <name>[_t113_mi<S>] <cpprun value> <unit> peer=<torch value> ratio=<torch/cpprun>
(ratio > 1: cpprun is faster / smaller; unsuffixed: torchrun 2.x; `_vs_shell`: the shell of
the floor figure; `_baseline`: --cpprun-baseline). Exit status 1 when any run
failed, 2 on a bad flag.
)";

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "launch_bench: %s\nTry 'launch_bench --help' for more information.\n",
               message.c_str());
  std::exit(2);
}

double parseDouble(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end == nullptr || *end != '\0' || errno == ERANGE || !std::isfinite(d)) {
    usageError("invalid value '" + v + "' for " + flag + ": expected a number");
  }
  if (d < lo || d > hi) {
    std::ostringstream os;
    os << "value " << v << " for " << flag << " is out of range (" << lo << " to " << hi << ")";
    usageError(os.str());
  }
  return d;
}

int parseInt(const std::string& flag, const std::string& v, int lo, int hi) {
  auto n = cpprun::parseUnsigned(flag, v, static_cast<uint64_t>(hi));
  if (!n.isOk()) usageError(n.status().message());
  if (n.value() < static_cast<uint64_t>(lo)) {
    usageError("value " + v + " for " + flag + " is out of range (" + std::to_string(lo) + " to " +
               std::to_string(hi) + ")");
  }
  return static_cast<int>(n.value());
}

std::vector<std::string> splitList(const std::string& flag, const std::string& v) {
  std::vector<std::string> out;
  if (v.empty()) usageError(flag + " needs at least one item");
  size_t pos = 0;
  while (true) {
    size_t comma = v.find(',', pos);
    out.push_back(v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Options parseFlags(int argc, char** argv) {
  Options o;
  cpprun::OptionCursor cursor(argc, argv);
  while (cursor.next()) {
    const std::string& name = cursor.name();
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (!cursor.isOption()) usageError("unexpected argument '" + name + "'");
    auto take = [&]() -> std::string {
      auto v = cursor.value();
      if (!v.isOk()) usageError(v.status().message());
      return v.value();
    };
    if (name == "--runs") {
      o.runs = parseInt(name, take(), 1, 1000);
    } else if (name == "--nproc") {
      o.nprocs.clear();
      for (const auto& item : splitList(name, take()))
        o.nprocs.push_back(parseInt(name, item, 1, 64));
    } else if (name == "--floor-nproc") {
      o.floor_nprocs.clear();
      for (const auto& item : splitList(name, take()))
        o.floor_nprocs.push_back(parseInt(name, item, 1, 256));
    } else if (name == "--memory-nproc") {
      o.memory_nproc = parseInt(name, take(), 1, 64);
    } else if (name == "--figures") {
      o.figures.clear();
      for (const auto& item : splitList(name, take())) {
        if (item != "floor" && item != "launch" && item != "failure" && item != "memory") {
          usageError("unknown figure '" + item + "' in --figures (floor, launch, failure, memory)");
        }
        o.figures.insert(item);
      }
    } else if (name == "--peers") {
      o.torchrun2 = o.torch113 = false;
      for (const auto& item : splitList(name, take())) {
        if (item == "torchrun2") {
          o.torchrun2 = true;
        } else if (item == "torch113") {
          o.torch113 = true;
        } else {
          usageError("unknown peer '" + item + "' in --peers (torchrun2, torch113)");
        }
      }
    } else if (name == "--torchrun") {
      o.torchrun = take();
    } else if (name == "--torch-monitor-intervals") {
      o.monitor_intervals.clear();
      for (const auto& item : splitList(name, take())) {
        o.monitor_intervals.push_back(parseDouble(name, item, 0.001, 60));
      }
    } else if (name == "--timeout") {
      o.timeout_s = parseDouble(name, take(), 1, 3600);
    } else if (name == "--cpprun") {
      o.cpprun = take();
    } else if (name == "--cpprun-baseline") {
      o.cpprun_baseline = take();
    } else if (name == "--worker") {
      o.worker = take();
    } else {
      usageError("unknown option '" + name + "'");
    }
  }
  return o;
}

// ------------------------------------------------------------------------------------------
// Interruption: the handler only records the signal and stops the running launcher; the main
// line notices (every wait polls the flag) and unwinds through the normal clean-up.

std::atomic<int> g_interrupted{0};
std::atomic<pid_t> g_current_launcher{0};

void onSignal(int signo) {
  g_interrupted.store(signo);
  pid_t pid = g_current_launcher.load();
  if (pid > 0) ::kill(pid, SIGTERM);
}

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

void checkInterrupted() {
  if (g_interrupted.load() != 0) throw Interrupted();
}

// ------------------------------------------------------------------------------------------
// /proc helpers

std::string readFile(const std::string& path) {
  cpprun::Result<std::string> text = cpprun::readFile(path);
  return text.isOk() ? std::move(text).value() : std::string();
}

std::string exeOf(pid_t pid) {
  char buf[PATH_MAX];
  std::string link = "/proc/" + std::to_string(pid) + "/exe";
  ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

pid_t parentOf(pid_t pid) {
  std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 4 > stat.size()) return -1;
  std::istringstream in(stat.substr(paren + 2));
  std::string state;
  pid_t ppid = -1;
  in >> state >> ppid;
  return ppid;
}

std::vector<pid_t> allPids() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0) out.push_back(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return out;
}

// Every descendant of `root` (not root itself), parents before children.
std::vector<pid_t> descendantsOf(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  for (pid_t p : allPids()) {
    pid_t pp = parentOf(p);
    if (pp > 0) children.emplace(pp, p);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    auto range = children.equal_range(p);
    for (auto it = range.first; it != range.second; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

// VmHWM of a process in kB; -1 when unreadable.
long vmHwmKb(pid_t pid) {
  std::istringstream in(readFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

std::string commOf(pid_t pid) {
  std::string c = readFile("/proc/" + std::to_string(pid) + "/comm");
  while (!c.empty() && c.back() == '\n') c.pop_back();
  return c;
}

std::string describeStatus(int st) {
  if (WIFEXITED(st)) return "exit status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by signal ") + strsignal(WTERMSIG(st));
  return "unknown status";
}

// Kills (SIGKILL, by PID) and reaps every process that was orphaned into this subreaper;
// returns a description of each ("" when none).
std::string reapLeftovers() {
  std::string found;
  const pid_t self = ::getpid();
  for (int round = 0; round < 100; ++round) {
    std::vector<pid_t> ours;
    for (pid_t p : allPids()) {
      if (p != self && parentOf(p) == self) ours.push_back(p);
    }
    // Zombies already reaped below do not show up again; anything alive is a leftover.
    bool any_alive = false;
    for (pid_t p : ours) {
      int st = 0;
      if (::waitpid(p, &st, WNOHANG) == p) continue;
      any_alive = true;
      found += " " + std::to_string(p) + "(" + commOf(p) + ")";
      ::kill(p, SIGKILL);
    }
    if (!any_alive) break;
    for (pid_t p : ours) {
      int st = 0;
      while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  return found;
}

// ------------------------------------------------------------------------------------------
// Temporary directory, removed with everything in it.

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/launch_bench_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A port free right now on 127.0.0.1 (racy by nature; each run takes a new one).
uint16_t pickFreePort() {
  const int port = cpprun::pickFreeTcpPort();
  if (port <= 0) throw std::runtime_error("cannot pick a free port");
  return static_cast<uint16_t>(port);
}

// ------------------------------------------------------------------------------------------
// Launchers

enum class Kind { kCpprun, kTorchrun2, kTorch113, kShell };

struct Variant {
  std::string label;  // "cpprun", "torchrun-2.15.0", "t1.13(mi=5)"
  Kind kind = Kind::kCpprun;
  double monitor_interval = 0;  // kTorch113 only
  std::string result_suffix;    // appended to RESULT names ("" for the anchor)
  // The store dialect of the launcher's store (worker and benchmark clients).
  cpprun::rendezvous::wire::Dialect dialect = cpprun::rendezvous::wire::Dialect::kLegacy;
  std::string binary;  // kCpprun: "" is --cpprun; the baseline names its build
};

// The environment of a launcher: ours without anything that would change what it does.
std::vector<std::string> launcherEnvironment() {
  static const char* kDrop[] = {"MASTER_ADDR", "MASTER_PORT",         "RANK",       "LOCAL_RANK",
                                "WORLD_SIZE",  "LOCAL_WORLD_SIZE",    "GROUP_RANK", "ROLE_RANK",
                                "NODE_RANK",   "PYTHONPATH",          "PYTHONHOME", "PYTHONSTARTUP",
                                "LOGLEVEL",    "CUDA_VISIBLE_DEVICES"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool drop = name.rfind("TORCHELASTIC_", 0) == 0 || name.rfind("PET_", 0) == 0 ||
                name.rfind("CPPRUN_", 0) == 0;
    for (const char* d : kDrop) drop = drop || name == d;
    if (!drop) env.push_back(entry);
  }
  return env;
}

// One launcher process: stdout and stderr go to a file in the run directory.
class Launcher {
 public:
  Launcher(std::vector<std::string> argv, const std::string& log_path) : log_path_(log_path) {
    int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error("cannot create " + log_path);
    int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    // Everything the child needs, prepared before fork (only async-signal-safe calls after).
    std::vector<std::string> env = launcherEnvironment();
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const pid_t parent = ::getpid();
    sigset_t all, saved, empty;
    sigfillset(&all);
    sigemptyset(&empty);
    ::pthread_sigmask(SIG_SETMASK, &all, &saved);
    t0_ = Clock::now();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGHUP, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &empty, nullptr);
      ::dup2(null_fd, 0);
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      ::execve(cargv[0], cargv.data(), cenv.data());
      static const char kMsg[] = "launch_bench: cannot execute the launcher\n";
      ssize_t ignored = ::write(2, kMsg, sizeof(kMsg) - 1);
      (void)ignored;
      ::_exit(127);
    }
    int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    ::close(log_fd);
    ::close(null_fd);
    if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(fork_errno)));
    pid_ = pid;
    g_current_launcher.store(pid_);
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }

  ~Launcher() {
    if (pid_ > 0) kill();
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Waits until the launcher exits or `deadline`; on exit records the status and the time.
  // Returns false on timeout.
  bool waitUntil(Clock::time_point deadline) {
    while (pid_ > 0) {
      checkInterrupted();
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      int tick = static_cast<int>(std::min<int64_t>(left.count(), 200));
      if (pidfd_ >= 0) {
        pollfd p{pidfd_, POLLIN, 0};
        int rc = ::poll(&p, 1, tick);
        if (rc > 0) reap(Clock::now());
      } else {
        int st = 0;
        pid_t r = ::waitpid(pid_, &st, WNOHANG);
        if (r == pid_) {
          finish(st, Clock::now());
        } else {
          std::this_thread::sleep_for(1ms);
        }
      }
    }
    return true;
  }

  // Stops the launcher and everything under it: SIGTERM to the launcher, up to 5 s, then
  // SIGKILL to it and to each process of its tree (a fresh snapshot, by PID). Reaps the
  // launcher. What a launcher that did exit left behind is re-parented to this subreaper and
  // collected by reapLeftovers(), so no PID from an old snapshot is ever signalled.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    auto deadline = Clock::now() + 5s;
    while (pid_ > 0 && Clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        finish(st, Clock::now());
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
    std::vector<pid_t> tree = descendantsOf(pid_);
    ::kill(pid_, SIGKILL);
    for (pid_t p : tree) ::kill(p, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    finish(st, Clock::now());
  }

  int status() const { return status_; }
  double wallMs() const { return std::chrono::duration<double, std::milli>(t1_ - t0_).count(); }

  std::string logTail(size_t max = 1500) const {
    std::string s = readFile(log_path_);
    if (s.size() > max) s = "..." + s.substr(s.size() - max);
    return s.empty() ? "" : "; its output ends with:\n" + s;
  }

 private:
  void reap(Clock::time_point now) {
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
    }
    if (r == pid_) finish(st, now);
  }
  void finish(int st, Clock::time_point now) {
    status_ = st;
    t1_ = now;
    g_current_launcher.store(0);
    pid_ = -1;
  }

  std::string log_path_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int status_ = -1;
  Clock::time_point t0_, t1_;
};

struct Bench {
  Options opt;
  std::string worker_real;  // realpath of the worker, to recognise it in /proc/<pid>/exe
  std::vector<Variant> variants;
  std::vector<std::string> errors;
};

std::vector<std::string> launcherArgv(const Bench& b, const Variant& v, int nproc, int max_restarts,
                                      uint16_t port, const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv;
  if (v.kind == Kind::kTorchrun2) {
    // The real CLI, default settings; only what it takes to run the same worker on one node.
    argv = {b.opt.torchrun,
            "--no-python",
            "--nproc-per-node=" + std::to_string(nproc),
            "--max-restarts=" + std::to_string(max_restarts),
            "--master-addr=" + std::string(kHost),
            "--master-port=" + std::to_string(port),
            b.opt.worker};
  } else if (v.kind == Kind::kTorch113) {
    std::ostringstream mi;
    mi << v.monitor_interval;
    argv = {kPython,
            b.opt.shim,
            "--nproc=" + std::to_string(nproc),
            "--port=" + std::to_string(port),
            "--addr=" + std::string(kHost),
            "--max-restarts=" + std::to_string(max_restarts),
            "--monitor-interval=" + mi.str(),
            "--rdzv-backend=static",
            b.opt.worker};
  } else {
    argv = {v.binary.empty() ? b.opt.cpprun : v.binary,
            "--nproc-per-node=" + std::to_string(nproc),
            "--max-restarts=" + std::to_string(max_restarts),
            "--master-addr=" + std::string(kHost),
            "--master-port=" + std::to_string(port),
            "--no-python",
            b.opt.worker};
  }
  for (const auto& a : worker_args) argv.push_back(a);
  if (v.dialect == cpprun::rendezvous::wire::Dialect::kV2) argv.push_back("v2");
  return argv;
}

// Runs after every launcher run: a launcher must leave no process behind. Returns false (and
// records the error) when it did; such a run does not count.
bool checkLeftovers(Bench* b, const std::string& what) {
  std::string left = reapLeftovers();
  if (left.empty()) return true;
  b->errors.push_back(what + ": processes left running after the launcher exited (killed):" + left);
  return false;
}

// Waits for the launcher's exit within the timeout; returns an error text ("" when it exited
// with status 0).
std::string finishRun(const Bench& b, Launcher* l, Clock::time_point deadline) {
  if (!l->waitUntil(deadline)) {
    l->kill();
    return "did not exit within " + fmt(b.opt.timeout_s, 1) + " s (killed)" + l->logTail();
  }
  if (!WIFEXITED(l->status()) || WEXITSTATUS(l->status()) != 0) {
    return describeStatus(l->status()) + l->logTail();
  }
  return "";
}

std::optional<int64_t> readNs(const std::string& path) {
  std::string s = readFile(path);
  if (s.empty() || s.find_first_not_of("0123456789\n") != std::string::npos) return std::nullopt;
  return std::strtoll(s.c_str(), nullptr, 10);
}

// ---- the three scenarios; each returns nullopt on failure (the error is recorded).

// One timed launcher run of `argv` with its log in `dir`: its wall time, or nullopt after
// recording why (an error, a timeout, or processes left behind) under `what`.
std::optional<double> timedRun(Bench* b, const std::vector<std::string>& argv, const TempDir& dir,
                               const std::string& what) {
  auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(b->opt.timeout_s * 1000));
  std::string err;
  double ms = 0;
  {
    Launcher l(argv, dir.path() + "/log");
    err = finishRun(*b, &l, deadline);
    ms = l.wallMs();
  }
  bool clean = checkLeftovers(b, what);
  if (!err.empty()) {
    b->errors.push_back(what + ": " + err);
    return std::nullopt;
  }
  if (!clean) return std::nullopt;
  return ms;
}

std::optional<double> runLaunch(Bench* b, const Variant& v, int nproc) {
  TempDir dir;
  uint16_t port = pickFreePort();
  return timedRun(b, launcherArgv(*b, v, nproc, 0, port, {"launch", dir.path()}), dir,
                  "launch np=" + std::to_string(nproc) + " " + v.label);
}

// The floor figure: N processes of /bin/true, started and reaped by cpprun, by a shell (the
// machine's floor: fork + exec + wait and nothing else) or by torchrun.
std::vector<std::string> floorArgv(const Bench& b, const Variant& v, int nproc, uint16_t port) {
  const std::string n = std::to_string(nproc);
  switch (v.kind) {
    case Kind::kShell:
      return {"/bin/sh", "-c",
              "i=0; while [ $i -lt \"$1\" ]; do /bin/true & i=$((i+1)); done; wait", "sh", n};
    case Kind::kTorchrun2:
      return {b.opt.torchrun,
              "--no-python",
              "--nproc-per-node=" + n,
              "--master-addr=" + std::string(kHost),
              "--master-port=" + std::to_string(port),
              "/bin/true"};
    default:
      return {v.binary.empty() ? b.opt.cpprun : v.binary,
              "--nproc-per-node=" + n,
              "--master-addr=" + std::string(kHost),
              "--master-port=" + std::to_string(port),
              "--no-python",
              "/bin/true"};
  }
}

std::optional<double> runFloor(Bench* b, const Variant& v, int nproc) {
  TempDir dir;
  uint16_t port = pickFreePort();
  return timedRun(b, floorArgv(*b, v, nproc, port), dir,
                  "floor np=" + std::to_string(nproc) + " " + v.label);
}

struct FailureSample {
  double detect_ms = 0;
  double restart_ms = 0;
};

std::optional<FailureSample> runFailure(Bench* b, const Variant& v) {
  TempDir dir;
  uint16_t port = pickFreePort();
  std::string what = "failure " + v.label;
  auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(b->opt.timeout_s * 1000));
  std::string err;
  {
    Launcher l(launcherArgv(*b, v, 2, 1, port, {"fail", dir.path()}), dir.path() + "/log");
    err = finishRun(*b, &l, deadline);
  }
  bool clean = checkLeftovers(b, what);
  if (!err.empty()) {
    b->errors.push_back(what + ": " + err);
    return std::nullopt;
  }
  if (!clean) return std::nullopt;
  auto death = readNs(dir.path() + "/death");
  auto term = readNs(dir.path() + "/term.0");
  std::optional<int64_t> first_start;
  for (int r = 0; r < 2; ++r) {
    auto s = readNs(dir.path() + "/start.1." + std::to_string(r));
    if (s && (!first_start || *s < *first_start)) first_start = s;
  }
  if (!death || !term || !first_start) {
    b->errors.push_back(what + ": missing timestamp files (death " + (death ? "ok" : "missing") +
                        ", rank 0 SIGTERM " + (term ? "ok" : "missing") + ", attempt-1 start " +
                        (first_start ? "ok" : "missing") + ")");
    return std::nullopt;
  }
  FailureSample s;
  s.detect_ms = static_cast<double>(*term - *death) / 1e6;
  s.restart_ms = static_cast<double>(*first_start - *death) / 1e6;
  return s;
}

struct MemorySample {
  double total_mib = 0;
  double first_mib = 0;  // the launched process (cpprun: guardian; torch: python)
  double rest_mib = 0;   // the others (cpprun: agent; torch: helpers, usually none)
  int helpers = 0;       // non-worker processes besides the launched one
};

std::optional<MemorySample> runMemory(Bench* b, const Variant& v, int nproc) {
  TempDir dir;
  uint16_t port = pickFreePort();
  std::string what = "memory np=" + std::to_string(nproc) + " " + v.label;
  auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(b->opt.timeout_s * 1000));
  std::string err;
  MemorySample s;
  {
    Launcher l(launcherArgv(*b, v, nproc, 0, port, {"hold", dir.path()}), dir.path() + "/log");
    try {
      TcpStoreClientOptions o;
      o.host = kHost;
      o.port = port;
      o.dialect = v.dialect;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      o.connect_timeout = std::min<std::chrono::milliseconds>(left, 60s);
      o.timeout = o.connect_timeout;
      TcpStoreClient store(o);
      store.wait({"bench/hold/all_ready"}, o.timeout);
      // Every worker is connected and blocked: sample the tree.
      int workers = 0;
      long first = vmHwmKb(l.pid());
      long rest = 0;
      for (pid_t p : descendantsOf(l.pid())) {
        if (exeOf(p) == b->worker_real) {
          ++workers;
          continue;
        }
        long kb = vmHwmKb(p);
        if (kb > 0) rest += kb;
        ++s.helpers;
      }
      store.set("bench/hold/release", toBytes("1"));
      if (first <= 0) throw std::runtime_error("cannot read VmHWM of the launcher");
      if (workers != nproc) {
        throw std::runtime_error("found " + std::to_string(workers) + " workers, expected " +
                                 std::to_string(nproc));
      }
      s.first_mib = static_cast<double>(first) / 1024.0;
      s.rest_mib = static_cast<double>(rest) / 1024.0;
      s.total_mib = s.first_mib + s.rest_mib;
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      err = std::string("sampling failed: ") + e.what();
      l.kill();
      err += l.logTail();
    }
    if (err.empty()) err = finishRun(*b, &l, deadline);
  }
  bool clean = checkLeftovers(b, what);
  if (!err.empty()) {
    b->errors.push_back(what + ": " + err);
    return std::nullopt;
  }
  if (!clean) return std::nullopt;
  return s;
}

// ------------------------------------------------------------------------------------------
// Statistics and output

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double minOf(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : *std::min_element(v.begin(), v.end());
}

std::string fmt(double v, int decimals) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// One figure: samples per variant (same order as Bench::variants).
struct Figure {
  std::string name;  // RESULT name
  std::string label;
  std::string unit;
  int decimals = 1;
  std::vector<std::vector<double>> samples;
};

std::string cell(const std::vector<double>& s, int decimals) {
  if (s.empty()) return "failed";
  return fmt(median(s), decimals) + " (" + fmt(minOf(s), decimals) + ")";
}

void printTable(const std::vector<Variant>& variants, const std::string& title,
                const std::vector<Figure>& figs) {
  std::printf("\n== %s\n", title.c_str());
  std::printf("%-28s", "figure");
  for (const auto& v : variants) std::printf(" %22s", v.label.c_str());
  for (size_t i = 1; i < variants.size(); ++i) {
    std::printf(" %22s", ("ratio " + variants[i].label).c_str());
  }
  std::printf(" %6s\n", "runs");
  for (const auto& f : figs) {
    std::printf("%-28s", (f.label + " " + f.unit).c_str());
    for (const auto& s : f.samples) std::printf(" %22s", cell(s, f.decimals).c_str());
    for (size_t i = 1; i < f.samples.size(); ++i) {
      std::printf(" %22s", fmt(median(f.samples[i]) / median(f.samples[0]), 1).c_str());
    }
    std::string runs;
    for (const auto& s : f.samples) runs += (runs.empty() ? "" : "/") + std::to_string(s.size());
    std::printf(" %6s\n", runs.c_str());
  }
}

void printResults(const std::vector<Variant>& variants, const std::vector<Figure>& figs) {
  for (const auto& f : figs) {
    double ours = median(f.samples[0]);
    for (size_t i = 1; i < f.samples.size(); ++i) {
      double peer = median(f.samples[i]);
      std::string name = f.name + variants[i].result_suffix;
      std::printf("RESULT %s %s %s peer=%s ratio=%s\n", name.c_str(), fmt(ours, f.decimals).c_str(),
                  f.unit.c_str(), fmt(peer, f.decimals).c_str(), fmt(peer / ours, 2).c_str());
    }
  }
}

void progress(const std::string& what) { std::fprintf(stderr, "launch_bench: %s\n", what.c_str()); }

int benchMain(Bench* b) {
  const Options& opt = b->opt;
  char real[PATH_MAX];
  if (::realpath(opt.worker.c_str(), real) == nullptr) {
    throw std::runtime_error("bench worker " + opt.worker + ": " + std::strerror(errno));
  }
  b->worker_real = real;
  if (::access(opt.cpprun.c_str(), X_OK) != 0) {
    throw std::runtime_error("cpprun binary " + opt.cpprun + ": " + std::strerror(errno));
  }
  if (opt.torchrun2 && ::access(opt.torchrun.c_str(), X_OK) != 0) {
    throw std::runtime_error("the torch 2.x peer needs torchrun at " + opt.torchrun + " (" +
                             std::strerror(errno) +
                             "); install it with packaging/setup.sh or pass --torchrun");
  }
  if (opt.torch113 && (::access(kPython, X_OK) != 0 || ::access(opt.shim.c_str(), R_OK) != 0)) {
    throw std::runtime_error(std::string("the torch 1.13 peer needs ") + kPython + " and " +
                             opt.shim);
  }
  if (!opt.cpprun_baseline.empty() && ::access(opt.cpprun_baseline.c_str(), X_OK) != 0) {
    throw std::runtime_error("--cpprun-baseline " + opt.cpprun_baseline + ": " +
                             std::strerror(errno));
  }
  b->variants.push_back(
      {"cpprun", Kind::kCpprun, 0, "", cpprun::rendezvous::wire::Dialect::kLegacy, ""});
  if (opt.torchrun2) {
    b->variants.push_back({std::string("torchrun-") + CPPRUN_TORCH2_VERSION, Kind::kTorchrun2, 0,
                           "", cpprun::rendezvous::wire::Dialect::kV2, ""});
  }
  if (opt.torch113) {
    for (double mi : opt.monitor_intervals) {
      std::ostringstream mis;
      mis << mi;
      std::string suffix = "_t113_mi" + mis.str();
      b->variants.push_back({"t1.13(mi=" + mis.str() + ")", Kind::kTorch113, mi, suffix,
                             cpprun::rendezvous::wire::Dialect::kLegacy, ""});
    }
  }
  const size_t nv = b->variants.size();
  // Rotates the order of `n` variants by the repetition index.
  auto orderOf = [](size_t n, int run) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = (i + static_cast<size_t>(run)) % n;
    return idx;
  };
  auto order = [&](int run) { return orderOf(nv, run); };
  std::optional<Variant> baseline;
  if (!opt.cpprun_baseline.empty()) {
    baseline = Variant{"cpprun-baseline",
                       Kind::kCpprun,
                       0,
                       "_baseline",
                       cpprun::rendezvous::wire::Dialect::kLegacy,
                       opt.cpprun_baseline};
  }
  // The floor figure: cpprun, the shell, torchrun 2.x, the baseline build.
  std::vector<Variant> floor_variants{b->variants[0]};
  floor_variants.push_back(
      {"sh", Kind::kShell, 0, "_vs_shell", cpprun::rendezvous::wire::Dialect::kLegacy, ""});
  if (opt.torchrun2) floor_variants.push_back(b->variants[1]);
  if (baseline) floor_variants.push_back(*baseline);
  // The memory figure: every variant and the baseline build.
  std::vector<Variant> memory_variants = b->variants;
  if (baseline) memory_variants.push_back(*baseline);
  auto t_start = Clock::now();

  std::printf("launch_bench: cpprun %s, worker %s\n", opt.cpprun.c_str(), opt.worker.c_str());
  if (opt.torchrun2) {
    std::printf("  peer torchrun-%s: %s, default settings (the anchor of the RESULT lines)\n",
                CPPRUN_TORCH2_VERSION, opt.torchrun.c_str());
  }
  if (opt.torch113) {
    std::printf(
        "  peer t1.13: torch 1.13 elastic_launch (%s %s; static rendezvous, agent-hosted store,\n"
        "  start_method spawn)\n",
        kPython, opt.shim.c_str());
  }
  if (baseline) std::printf("  baseline: %s\n", opt.cpprun_baseline.c_str());
  std::printf(
      "runs per figure: %d, variants alternating; table cells: median (min); "
      "ratio = torch/cpprun (> 1: cpprun better)\n",
      opt.runs);
  std::fflush(stdout);

  std::vector<Figure> floor_figs, launch_figs, failure_figs, memory_figs;
  if (opt.figures.count("floor")) {
    const size_t nf = floor_variants.size();
    for (int n : opt.floor_nprocs) {
      floor_figs.push_back({"floor_np" + std::to_string(n) + "_ms",
                            "/bin/true x " + std::to_string(n), "ms", 2,
                            std::vector<std::vector<double>>(nf)});
    }
    for (int run = 0; run < opt.runs; ++run) {
      for (size_t fi = 0; fi < opt.floor_nprocs.size(); ++fi) {
        for (size_t vi : orderOf(nf, run)) {
          progress("floor nproc " + std::to_string(opt.floor_nprocs[fi]) + " " +
                   floor_variants[vi].label + " run " + std::to_string(run + 1));
          auto ms = runFloor(b, floor_variants[vi], opt.floor_nprocs[fi]);
          if (ms) floor_figs[fi].samples[vi].push_back(*ms);
        }
      }
    }
  }
  if (opt.figures.count("launch")) {
    for (int n : opt.nprocs) {
      launch_figs.push_back({"launch_np" + std::to_string(n) + "_ms",
                             "launch nproc " + std::to_string(n), "ms", 1,
                             std::vector<std::vector<double>>(nv)});
    }
    for (int run = 0; run < opt.runs; ++run) {
      for (size_t fi = 0; fi < opt.nprocs.size(); ++fi) {
        for (size_t vi : order(run)) {
          progress("launch nproc " + std::to_string(opt.nprocs[fi]) + " " + b->variants[vi].label +
                   " run " + std::to_string(run + 1));
          auto ms = runLaunch(b, b->variants[vi], opt.nprocs[fi]);
          if (ms) launch_figs[fi].samples[vi].push_back(*ms);
        }
      }
    }
  }
  if (opt.figures.count("failure")) {
    failure_figs.push_back({"failure_detect_ms", "failure: SIGTERM to rank 0", "ms", 2,
                            std::vector<std::vector<double>>(nv)});
    failure_figs.push_back({"failure_restart_ms", "failure: attempt 1 started", "ms", 1,
                            std::vector<std::vector<double>>(nv)});
    for (int run = 0; run < opt.runs; ++run) {
      for (size_t vi : order(run)) {
        progress("failure " + b->variants[vi].label + " run " + std::to_string(run + 1));
        auto s = runFailure(b, b->variants[vi]);
        if (!s) continue;
        failure_figs[0].samples[vi].push_back(s->detect_ms);
        failure_figs[1].samples[vi].push_back(s->restart_ms);
      }
    }
  }
  const size_t nm = memory_variants.size();
  std::vector<std::vector<double>> guardian_mib(nm), agent_mib(nm);  // cpprun builds
  std::vector<std::vector<int>> torch_helpers(nm);                   // per variant
  if (opt.figures.count("memory")) {
    std::string np = std::to_string(opt.memory_nproc);
    memory_figs.push_back({"agent_peak_rss_np" + np + "_mib", "launcher VmHWM, nproc " + np, "MiB",
                           2, std::vector<std::vector<double>>(nm)});
    for (int run = 0; run < opt.runs; ++run) {
      for (size_t vi : orderOf(nm, run)) {
        progress("memory " + memory_variants[vi].label + " run " + std::to_string(run + 1));
        auto s = runMemory(b, memory_variants[vi], opt.memory_nproc);
        if (!s) continue;
        memory_figs[0].samples[vi].push_back(s->total_mib);
        if (memory_variants[vi].kind == Kind::kCpprun) {
          guardian_mib[vi].push_back(s->first_mib);
          agent_mib[vi].push_back(s->rest_mib);
        } else {
          torch_helpers[vi].push_back(s->helpers);
        }
      }
    }
  }

  if (!floor_figs.empty()) {
    printTable(floor_variants,
               "Floor: cpprun --nproc-per-node=N --no-python /bin/true; sh: N x (/bin/true &), "
               "wait",
               floor_figs);
  }
  if (!launch_figs.empty()) {
    printTable(b->variants,
               "Launch: fork of the launcher -> launcher exited; worker = connect + set",
               launch_figs);
  }
  if (!failure_figs.empty()) {
    printTable(b->variants,
               "Failure (nproc 2, max restarts 1): times after rank 1's SIGKILL of itself",
               failure_figs);
  }
  if (!memory_figs.empty()) {
    printTable(memory_variants,
               "Agent memory: VmHWM summed over the launcher's non-worker processes", memory_figs);
    for (size_t vi = 0; vi < nm; ++vi) {
      if (memory_variants[vi].kind == Kind::kCpprun) {
        std::printf("  %s: guardian %s MiB + agent %s MiB (medians)\n",
                    memory_variants[vi].label.c_str(), fmt(median(guardian_mib[vi]), 2).c_str(),
                    fmt(median(agent_mib[vi]), 2).c_str());
        continue;
      }
      const auto& h = torch_helpers[vi];
      std::printf("  %s: non-worker processes besides the launched python: max %d\n",
                  memory_variants[vi].label.c_str(),
                  h.empty() ? 0 : *std::max_element(h.begin(), h.end()));
    }
  }

  std::printf("\n== Targets (information, not enforced; against %s, last column: %s)\n",
              nv > 1 ? b->variants[1].label.c_str() : "-",
              nv > 1 ? b->variants[nv - 1].label.c_str() : "-");
  auto target = [](const std::string& what, bool measured, bool pass, const std::string& detail) {
    std::printf("   %-50s %s  %s\n", what.c_str(),
                !measured ? "NOT MEASURED"
                : pass    ? "MET"
                          : "NOT MET",
                detail.c_str());
  };
  for (const auto& f : floor_figs) {
    // Floor variants: 0 cpprun, 1 the shell, then torchrun 2.x when it runs.
    const double ours = median(f.samples[0]);
    const double shell = median(f.samples[1]);
    target(f.label + ": cpprun within 1.25x of sh", !f.samples[0].empty() && !f.samples[1].empty(),
           ours <= 1.25 * shell, "cpprun/sh " + fmt(ours / shell, 2));
    if (opt.torchrun2) {
      const double torch = median(f.samples[2]);
      target(f.label + ": cpprun >= 100x faster than torchrun",
             !f.samples[0].empty() && !f.samples[2].empty(), torch >= 100 * ours,
             "ratio " + fmt(torch / ours, 1));
    }
  }
  if (nv > 1) {
    for (const auto& f : launch_figs) {
      double r = median(f.samples[1]) / median(f.samples[0]);
      double r_last = median(f.samples[nv - 1]) / median(f.samples[0]);
      bool measured = !f.samples[0].empty() && !f.samples[1].empty();
      target(
          f.label + ": cpprun >= 20x faster", measured, r >= 20,
          "ratio " + fmt(r, 1) + " (vs " + b->variants[nv - 1].label + ": " + fmt(r_last, 1) + ")");
    }
    if (!failure_figs.empty()) {
      double d = median(failure_figs[0].samples[0]);
      target("failure detection < 5 ms", !failure_figs[0].samples[0].empty(), d < 5,
             fmt(d, 2) + " ms");
    }
    if (!memory_figs.empty()) {
      double r = median(memory_figs[0].samples[1]) / median(memory_figs[0].samples[0]);
      bool measured = !memory_figs[0].samples[0].empty() && !memory_figs[0].samples[1].empty();
      target("agent peak RSS <= 1/20 of torch's", measured, r >= 20, "ratio " + fmt(r, 1));
    }
  }

  std::printf("\n");
  printResults(floor_variants, floor_figs);
  if (nv > 1) {
    printResults(b->variants, launch_figs);
    printResults(b->variants, failure_figs);
  }
  if (memory_variants.size() > 1) printResults(memory_variants, memory_figs);
  if (!b->errors.empty()) {
    std::printf("\n%zu run(s) failed:\n", b->errors.size());
    for (const auto& e : b->errors) std::printf("  - %s\n", e.c_str());
  }
  std::printf("\ntotal %.1f s\n", std::chrono::duration<double>(Clock::now() - t_start).count());
  std::fflush(stdout);
  return b->errors.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Bench b;
  b.opt = parseFlags(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  // Orphans of a launcher come back here, to be found and reaped (see reapLeftovers).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  try {
    return benchMain(&b);
  } catch (const Interrupted&) {
    // The launcher and its directory are gone by now (destructors); collect any orphans.
    std::string left = reapLeftovers();
    std::fflush(stdout);
    std::fprintf(stderr, "launch_bench: interrupted by signal %d%s\n", g_interrupted.load(),
                 left.empty() ? "" : ("; killed leftover processes:" + left).c_str());
    return 128 + g_interrupted.load();
  } catch (const std::exception& e) {
    reapLeftovers();
    std::fflush(stdout);
    std::fprintf(stderr, "launch_bench: error: %s\n", e.what());
    return 1;
  }
}
