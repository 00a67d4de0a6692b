// store_bench: our TCP store server against PyTorch's, same client, same work, same run.
//
//   store_bench [--seconds S] [--runs N] [--clients 1,16,64,256] [--storm 1024,4096] [--quick]
//               [--peers torch2,torch113]
//
// Starts three servers as child processes on 127.0.0.1: the cpprun-store daemon (--port 0),
// torch 2.x's libuv TCPStore server (tests/bench/torch_store_server.py --backend libuv under
// CPPRUN_TORCH2_PYTHON) and torch 1.13's TCPStore server (the same script under
// /usr/bin/python3; the legacy server, the only one 1.13 has). Every server is driven by our
// TcpStoreClient in the dialect of its peer comparison: libuv and ours as "ours-v2" in the 2.2+
// dialect (VALIDATE handshake; torch 2.x's numbering), torch 1.13 and ours as "ours" in the
// legacy dialect. The comparison with torch 2.x is the anchor (unsuffixed RESULT names); the one
// with torch 1.13 carries "_t113".
//
// Mixed workload: C threads, one TcpStoreClient each; per iteration: set own key, get it (the
// client does WAIT + GET, as torch's does), add to a shared counter, wait on an existing key,
// compareSet own key. Each measurement runs for --seconds after a warm-up; every configuration
// is repeated --runs times, alternating which server goes first; medians are reported.
//
// Connect storm: N clients, all driven by one thread with non-blocking sockets and epoll,
// connect, handshake (none in the legacy dialect; VALIDATE + PING in the V2 dialect, against
// ours and libuv) and ADD "init/" 1, keeping their connections open. Timed from the
// first connect() until the last reply; refused or reset connections are retried and counted;
// the final init/ count is checked through one more client. Each storm is run twice over:
// "warm" against the long-running servers, and "cold" against a freshly started server (what
// a store sees at job start; storm_<N>_cold_* figures).
//
// Also reported: CPU time per operation of the server process and of this process (all client
// threads), from /proc/<pid>/task/*/schedstat (ns) and getrusage, and the server's CPU time
// during each storm; on a small machine the client shares the CPUs with the server, so server
// CPU per op shows the server's own cost where ops/s cannot.
//
// Prints a table and one line per figure: RESULT <name> <value> <unit> peer=<torch> ratio=<x>.
// Targets are printed as information; the exit status is 1 only when a measurement failed
// (a server died, a reply was wrong, a count did not match), 2 on a bad flag.
//
// Every child is ended by PID (SIGTERM, then SIGKILL after a bounded wait) and reaped, on
// normal exit, on errors, and when the benchmark itself gets SIGINT/SIGTERM; children also get
// PR_SET_PDEATHSIG so that they die with the benchmark if it is killed outright.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
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

#ifndef STORE_BENCH_SOURCE_DIR
#error "STORE_BENCH_SOURCE_DIR must name the source tree"
#endif
#ifndef STORE_BENCH_DAEMON
#error "STORE_BENCH_DAEMON must name the cpprun-store binary"
#endif

namespace {

using cpprun::rendezvous::Bytes;
using cpprun::rendezvous::StoreError;
using cpprun::rendezvous::TcpStoreClient;
using cpprun::rendezvous::TcpStoreClientOptions;
using cpprun::rendezvous::toBytes;
namespace wire = cpprun::rendezvous::wire;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

#ifndef CPPRUN_TORCH2_PYTHON
#error "CPPRUN_TORCH2_PYTHON must name the torch 2.x venv's python"
#endif
#ifndef CPPRUN_TORCH2_VERSION
#error "CPPRUN_TORCH2_VERSION must name the pinned torch 2.x version"
#endif

constexpr const char* kPython = "/usr/bin/python3";  // Debian's torch 1.13
constexpr const char* kHost = "127.0.0.1";

double secondsSince(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

// ------------------------------------------------------------------------------------------
// Flags

struct Options {
  double seconds = 2.0;
  double warmup = 0.5;
  int runs = 3;
  std::vector<int> clients{1, 16, 64, 256};
  std::vector<int> storm{1024, 4096};
  bool quick = false;
  bool torch2 = true;  // --peers
  bool torch113 = true;
  std::string torch2_python = CPPRUN_TORCH2_PYTHON;
  std::string torch2_listen = "ipv4";  // --torch2-listen
  std::string daemon = STORE_BENCH_DAEMON;
  std::string torch_script =
      std::string(STORE_BENCH_SOURCE_DIR) + "/tests/bench/torch_store_server.py";
};

constexpr const char* kUsage = R"(Usage: store_bench [options]

Benchmarks our TCP store server (the cpprun-store daemon) against torch 2.x's libuv TCPStore
server (the anchor; client in the 2.2+ dialect) and torch 1.13's TCPStore server (client in the
legacy dialect), with the same client (TcpStoreClient) on 127.0.0.1, in the same run.

Options:
  --seconds S        measured duration of each mixed-workload run (default 2; --quick 0.25)
  --warmup S         warm-up before each measured run (default 0.5; --quick 0.05)
  --runs N           repetitions of every configuration, servers alternating (default 3;
                     --quick 1); medians are reported
  --clients LIST     concurrent clients of the mixed workload, comma separated
                     (default 1,16,64,256; --quick 1,16,64); an empty list
                     skips the mixed workload
  --storm LIST       connect-storm sizes, comma separated (default 1024,4096; --quick 1024);
                     an empty list skips the storm
  --quick            short smoke-test run (the defaults above); other flags still override
  --peers LIST       any of torch2,torch113 (default: both)
  --torch2-python P  torch 2.x's python (default: CPPRUN_TORCH2_PYTHON of the build)
  --torch2-listen L  ipv4 (default): the libuv server gets an IPv4 socket on 127.0.0.1, so it
                     names each client from /etc/hosts; default: TCPStore's own dual-stack
                     bind, where it asks DNS for every client's name (::ffff:127.0.0.1) on its
                     loop thread -- a storm then measures the resolver
  --daemon PATH      the cpprun-store binary (default: the one built with this benchmark)
  --help             show this help and exit

Output: a table, then one line per figure and peer:
  RESULT <name>[_t113] <value> <unit> peer=<torch value> ratio=<ours/torch>
(unsuffixed: ours in the 2.2+ dialect against torch 2.x's libuv server; _t113: ours in the
legacy dialect against torch 1.13's server)
)";

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "store_bench: %s\nTry 'store_bench --help' for more information.\n",
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

std::vector<int> parseList(const std::string& flag, const std::string& v, int lo, int hi,
                           bool allow_empty) {
  std::vector<int> out;
  if (v.empty()) {
    if (!allow_empty) usageError(flag + " needs at least one number");
    return out;
  }
  size_t pos = 0;
  while (true) {
    size_t comma = v.find(',', pos);
    std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    out.push_back(parseInt(flag, item, lo, hi));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Options parseFlags(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& a : args) {
    if (a == "--quick") {
      o.quick = true;
      o.seconds = 0.25;
      o.warmup = 0.05;
      o.runs = 1;
      o.clients = {1, 16, 64};
      o.storm = {1024};
    }
  }
  cpprun::OptionCursor cursor(args);
  while (cursor.next()) {
    const std::string& name = cursor.name();
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (!cursor.isOption()) usageError("unexpected argument '" + name + "'");
    const bool has_value = cursor.hasInlineValue();
    auto take = [&]() -> std::string {
      auto v = cursor.value();
      if (!v.isOk()) usageError(v.status().message());
      return v.value();
    };
    if (name == "--quick") {
      if (has_value) usageError("--quick takes no value");
    } else if (name == "--seconds") {
      o.seconds = parseDouble(name, take(), 0.01, 3600);
    } else if (name == "--warmup") {
      o.warmup = parseDouble(name, take(), 0, 600);
    } else if (name == "--runs") {
      o.runs = parseInt(name, take(), 1, 1000);
    } else if (name == "--clients") {
      o.clients = parseList(name, take(), 1, 4096, true);
    } else if (name == "--storm") {
      o.storm = parseList(name, take(), 1, 60000, true);
    } else if (name == "--peers") {
      o.torch2 = o.torch113 = false;
      std::string v = take();
      size_t pos = 0;
      while (true) {
        size_t comma = v.find(',', pos);
        std::string item = v.substr(pos, comma == std::string::npos ? comma : comma - pos);
        if (item == "torch2") {
          o.torch2 = true;
        } else if (item == "torch113") {
          o.torch113 = true;
        } else {
          usageError("unknown peer '" + item + "' in --peers (torch2, torch113)");
        }
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (name == "--torch2-python") {
      o.torch2_python = take();
      if (o.torch2_python.empty()) usageError("--torch2-python must not be empty");
    } else if (name == "--torch2-listen") {
      o.torch2_listen = take();
      if (o.torch2_listen != "ipv4" && o.torch2_listen != "default") {
        usageError("--torch2-listen takes ipv4 or default, not '" + o.torch2_listen + "'");
      }
    } else if (name == "--daemon") {
      o.daemon = take();
      if (o.daemon.empty()) usageError("--daemon must not be empty");
    } else {
      usageError("unknown option '" + name + "'");
    }
  }
  return o;
}

// ------------------------------------------------------------------------------------------
// Child processes

// PIDs of live children, for the signal handler (plain atomics: async-signal-safe).
constexpr int kMaxChildren = 8;
std::array<std::atomic<pid_t>, kMaxChildren> g_children{};

void registerChild(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid)) return;
  }
}

void unregisterChild(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

// Ends every registered child (TERM, up to 3 s, KILL), reaps it, and exits. Only
// async-signal-safe calls.
void onFatalSignal(int signo) {
  static const char kMsg[] = "store_bench: interrupted; stopping the servers\n";
  ssize_t ignored = ::write(2, kMsg, sizeof(kMsg) - 1);
  (void)ignored;
  for (auto& slot : g_children) {
    pid_t pid = slot.load();
    if (pid > 0) ::kill(pid, SIGTERM);
  }
  for (auto& slot : g_children) {
    pid_t pid = slot.load();
    if (pid <= 0) continue;
    bool reaped = false;
    for (int i = 0; i < 300 && !reaped; ++i) {
      int st = 0;
      pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid || (r < 0 && errno == ECHILD)) {
        reaped = true;
        break;
      }
      timespec ts{0, 10 * 1000 * 1000};
      ::nanosleep(&ts, nullptr);
    }
    if (!reaped) {
      ::kill(pid, SIGKILL);
      int st = 0;
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
    slot.store(0);
  }
  ::_exit(128 + signo);
}

// A child with stdout on a pipe (for its ready line) and stderr in an unlinked temporary file
// (so it can never block on a full pipe; its tail goes into error messages).
class Child {
 public:
  Child(std::string name, const std::vector<std::string>& argv, bool stdin_pipe)
      : name_(std::move(name)) {
    char tmpl[] = "/tmp/store_bench_stderr_XXXXXX";
    stderr_fd_ = ::mkostemp(tmpl, O_CLOEXEC);
    if (stderr_fd_ < 0) throw std::runtime_error("mkostemp: " + std::string(std::strerror(errno)));
    ::unlink(tmpl);
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
    }
    int in[2] = {-1, -1};
    if (stdin_pipe) {
      if (::pipe2(in, O_CLOEXEC) != 0) {
        ::close(out[0]);
        ::close(out[1]);
        throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
      }
    } else {
      in[0] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    // Everything the child needs, prepared before fork (only async-signal-safe calls after).
    std::vector<std::vector<char>> storage;
    std::vector<char*> cargv;
    for (const auto& a : argv) {
      storage.emplace_back(a.begin(), a.end());
      storage.back().push_back('\0');
    }
    for (auto& s : storage) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    pid_t parent = ::getpid();
    sigset_t empty, all, saved;
    sigemptyset(&empty);
    sigfillset(&all);

    // Signals stay blocked from fork until the child has dropped our handlers, so a SIGTERM
    // sent to a child that has not exec'd yet kills it instead of running onFatalSignal there.
    ::pthread_sigmask(SIG_SETMASK, &all, &saved);
    pid_t pid = ::fork();
    if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    if (pid < 0) {
      int err = errno;
      ::close(out[0]);
      ::close(out[1]);
      if (in[0] >= 0) ::close(in[0]);
      if (in[1] >= 0) ::close(in[1]);
      throw std::runtime_error("fork: " + std::string(std::strerror(err)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::signal(SIGPIPE, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGHUP, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &empty, nullptr);
      if (in[0] >= 0) ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(stderr_fd_, 2);
      ::execv(cargv[0], cargv.data());
      // Only async-signal-safe calls here: write the path piecewise.
      static const char kMsg[] = "store_bench: cannot execute ";
      ssize_t ignored = ::write(2, kMsg, sizeof(kMsg) - 1);
      ignored = ::write(2, cargv[0], std::strlen(cargv[0]));
      ignored = ::write(2, "\n", 1);
      (void)ignored;
      ::_exit(127);
    }
    pid_ = pid;
    registerChild(pid_);
    ::close(out[1]);
    stdout_fd_ = out[0];
    if (in[0] >= 0) ::close(in[0]);
    stdin_fd_ = in[1];
  }

  ~Child() {
    stop();
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    if (stderr_fd_ >= 0) ::close(stderr_fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // Reads stdout until a line starting with `prefix`; returns the rest of that line.
  std::string waitForLine(const std::string& prefix, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (true) {
      size_t nl;
      while ((nl = stdout_buf_.find('\n')) != std::string::npos) {
        std::string line = stdout_buf_.substr(0, nl);
        stdout_buf_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        throw std::runtime_error(name_ + " did not print '" + prefix + "...' within " +
                                 std::to_string(timeout.count()) + " ms" + stderrTail());
      }
      pollfd p{stdout_fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
      if (n > 0) {
        stdout_buf_.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        throw std::runtime_error(name_ + " exited before printing '" + prefix + "...'" +
                                 stderrTail());
      }
    }
  }

  // Empty while the child runs; otherwise how it ended (and reaps it).
  std::string exitedHow() {
    if (pid_ <= 0) return "already stopped";
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r != pid_) return "";
    unregisterChild(pid_);
    pid_ = -1;
    status_ = st;
    return describeStatus(st);
  }

  // SIGTERM, up to 5 s, then SIGKILL; always reaps. Idempotent. Returns how it ended.
  std::string stop() {
    if (pid_ <= 0) return status_ >= 0 ? describeStatus(status_) : "not started";
    if (stdin_fd_ >= 0) {
      ::close(stdin_fd_);
      stdin_fd_ = -1;
    }
    ::kill(pid_, SIGTERM);
    bool reaped = false;
    int st = 0;
    for (int i = 0; i < 500; ++i) {
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped = true;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    std::string how;
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      how = "did not exit within 5 s of SIGTERM; killed. ";
    }
    unregisterChild(pid_);
    pid_ = -1;
    status_ = st;
    return how + describeStatus(st);
  }

  std::string stderrTail(size_t max = 2000) const {
    off_t size = ::lseek(stderr_fd_, 0, SEEK_END);
    if (size <= 0) return "";
    off_t from = size > static_cast<off_t>(max) ? size - static_cast<off_t>(max) : 0;
    std::string s(static_cast<size_t>(size - from), '\0');
    ssize_t n = ::pread(stderr_fd_, s.data(), s.size(), from);
    if (n <= 0) return "";
    s.resize(static_cast<size_t>(n));
    return "; its stderr ends with:\n" + s;
  }

 private:
  static std::string describeStatus(int st) {
    if (WIFEXITED(st)) return "exit status " + std::to_string(WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return std::string("killed by signal ") + strsignal(WTERMSIG(st));
    return "unknown status";
  }

  std::string name_;
  pid_t pid_ = -1;
  int status_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::string stdout_buf_;
};

enum class ServerKind { kOurs, kTorch2, kTorch113 };

struct Server {
  std::string name;  // "ours", "libuv" (torch 2.x) or "t1.13"
  ServerKind kind = ServerKind::kOurs;
  std::unique_ptr<Child> child;
  uint16_t port = 0;
  std::unique_ptr<TcpStoreClient> control;  // client for checks, in the server's dialect

  // The dialect of the control connection: ours speaks both, libuv needs the 2.2+ one.
  wire::Dialect controlDialect() const {
    return kind == ServerKind::kTorch2 ? wire::Dialect::kV2 : wire::Dialect::kLegacy;
  }

  void checkAlive() {
    std::string how = child->exitedHow();
    if (!how.empty()) {
      throw std::runtime_error(name + " server (pid gone) died: " + how + child->stderrTail());
    }
  }
};

uint16_t parsePort(const std::string& text, const std::string& what) {
  auto colon = text.rfind(':');
  std::string digits = colon == std::string::npos ? text : text.substr(colon + 1);
  while (!digits.empty() && (digits.back() == '\r' || digits.back() == ' ')) digits.pop_back();
  if (digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    throw std::runtime_error("cannot read a port from " + what + "'s line '" + text + "'");
  }
  int p = std::atoi(digits.c_str());
  if (p <= 0 || p > 65535) throw std::runtime_error("bad port in '" + text + "'");
  return static_cast<uint16_t>(p);
}

std::unique_ptr<TcpStoreClient> makeClient(uint16_t port, wire::Dialect dialect);

// Starts the server's process; ready() then waits for its port line and connects `control`.
void launch(Server* s, const Options& opt) {
  if (s->kind == ServerKind::kTorch2) {
    s->child = std::make_unique<Child>(
        "torch_store_server.py (torch " CPPRUN_TORCH2_VERSION ", libuv)",
        std::vector<std::string>{opt.torch2_python, opt.torch_script, "--backend", "libuv",
                                 "--listen", opt.torch2_listen},
        true);
  } else if (s->kind == ServerKind::kTorch113) {
    s->child = std::make_unique<Child>("torch_store_server.py (torch 1.13)",
                                       std::vector<std::string>{kPython, opt.torch_script},
                                       true);  // legacy: 1.13's only one
  } else {
    s->child = std::make_unique<Child>(
        "cpprun-store", std::vector<std::string>{opt.daemon, "--host", kHost, "--port", "0"},
        false);
  }
}

void ready(Server* s) {
  if (s->kind == ServerKind::kOurs) {
    s->port = parsePort(s->child->waitForLine("cpprun-store listening on ", 20s), "cpprun-store");
  } else {
    s->port = parsePort(s->child->waitForLine("PORT ", 120s), s->child->name());
    std::string backend = s->child->waitForLine("BACKEND ", 10s);
    const char* want = s->kind == ServerKind::kTorch2 ? "libuv" : "legacy";
    if (backend != want) {
      throw std::runtime_error(s->child->name() + " runs the '" + backend + "' server, not " +
                               want);
    }
  }
  s->control = makeClient(s->port, s->controlDialect());
}

// Ends the server (control connection first); returns how its process ended.
std::string shutdown(Server* s) {
  s->control.reset();
  return s->child ? s->child->stop() : "not started";
}

std::unique_ptr<TcpStoreClient> makeClient(uint16_t port, wire::Dialect dialect) {
  TcpStoreClientOptions o;
  o.host = kHost;
  o.port = port;
  o.dialect = dialect;
  o.connect_timeout = 20s;
  o.timeout = 30s;
  return std::make_unique<TcpStoreClient>(o);
}

// ------------------------------------------------------------------------------------------
// Statistics

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Nearest-rank percentile of nanosecond samples, in microseconds.
double percentileUs(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return std::nan("");
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  rank = std::min(std::max<size_t>(rank, 1), v.size()) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank), v.end());
  return v[rank] / 1000.0;
}

// CPU time (user + system, all threads) a process has used so far, in seconds; NaN when
// unreadable. Tick resolution (10 ms), fine over runs of a second or more.
double processCpuSecondsFromStat(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return std::nan("");
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  double utime = 0, stime = 0;
  // Fields after the command: state(3) ... utime(14) stime(15).
  for (int i = 3; i <= 15 && (in >> field); ++i) {
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) stime = std::strtod(field.c_str(), nullptr);
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The same in nanosecond resolution where the kernel has schedstats: the sum of the time on a
// CPU of every live thread (/proc/<pid>/task/*/schedstat, first field), which a storm of 100 ms
// needs. The servers' threads live as long as the server, so no exited thread's time is lost
// between two readings. Falls back to processCpuSecondsFromStat().
double processCpuSeconds(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(tasks.c_str());
  if (d == nullptr) return processCpuSecondsFromStat(pid);
  double total_ns = 0;
  bool any = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(tasks + "/" + e->d_name + "/schedstat");
    double ns = 0;
    if (f >> ns) {
      total_ns += ns;
      any = true;
    }
  }
  ::closedir(d);
  return any ? total_ns / 1e9 : processCpuSecondsFromStat(pid);
}

double selfCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
  };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// ------------------------------------------------------------------------------------------
// Mixed workload

enum Op { kSet, kGet, kAdd, kWait, kCas, kNumOps };
constexpr int kAll = kNumOps;  // index of "every op" in the percentile arrays
const char* const kOpNames[] = {"set", "get", "add", "wait", "cas", "all"};

enum Phase : int { kWarmup, kMeasure, kStop };

struct MixedRun {
  double ops_per_s = 0;
  uint64_t ops = 0;
  double server_cpu_us_per_op = 0;  // the server process's CPU time over the measured window
  double client_cpu_us_per_op = 0;  // this process's (all client threads)
  std::array<double, kNumOps + 1> p50_us{};
  std::array<double, kNumOps + 1> p99_us{};
};

struct ThreadResult {
  std::array<std::vector<uint32_t>, kNumOps> lat;
  uint64_t adds_done = 0;
  std::string error;
};

MixedRun runMixed(Server& server, wire::Dialect dialect, int nclients, const Options& opt,
                  int run_id) {
  server.checkAlive();
  const std::string prefix = "bench/m" + std::to_string(run_id) + "/";
  const std::string counter = prefix + "counter";
  const std::string ready = prefix + "ready";
  server.control->set(ready, std::string("1"));

  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  clients.reserve(static_cast<size_t>(nclients));
  for (int i = 0; i < nclients; ++i) clients.push_back(makeClient(server.port, dialect));

  std::atomic<int> phase{kWarmup};
  std::atomic<int> started{0};
  std::vector<ThreadResult> results(static_cast<size_t>(nclients));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(nclients));
  auto body = [&](int t) {
    TcpStoreClient& c = *clients[static_cast<size_t>(t)];
    ThreadResult& r = results[static_cast<size_t>(t)];
    for (auto& v : r.lat) v.reserve(1 << 14);
    const std::string own = prefix + "k/" + std::to_string(t);
    const std::string cas = prefix + "cas/" + std::to_string(t);
    const Bytes value(32, static_cast<uint8_t>('a' + t % 26));
    const std::vector<std::string> wait_keys{ready};
    Bytes cas_current;  // empty: the key does not exist yet
    uint64_t cas_n = 0;
    started.fetch_add(1);
    auto timed = [&](Op op, const std::function<void()>& fn) {
      int ph = phase.load(std::memory_order_relaxed);
      auto t0 = Clock::now();
      fn();
      auto t1 = Clock::now();
      if (ph == kMeasure && phase.load(std::memory_order_relaxed) == kMeasure) {
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
        r.lat[op].push_back(static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX)));
      }
    };
    try {
      while (phase.load(std::memory_order_relaxed) != kStop) {
        timed(kSet, [&] { c.set(own, value); });
        timed(kGet, [&] {
          if (c.get(own) != value) throw StoreError("get returned a wrong value");
        });
        timed(kAdd, [&] { c.add(counter, 1); });
        ++r.adds_done;
        timed(kWait, [&] { c.wait(wait_keys, 30s); });
        timed(kCas, [&] {
          Bytes desired = toBytes(std::to_string(++cas_n));
          Bytes got = c.compareSet(cas, cas_current, desired);
          if (got != desired) throw StoreError("compareSet did not succeed on an own key");
          cas_current = std::move(desired);
        });
      }
    } catch (const std::exception& e) {
      r.error = e.what();
      phase.store(kStop);
    }
  };
  try {
    for (int t = 0; t < nclients; ++t) threads.emplace_back(body, t);
  } catch (...) {
    phase.store(kStop);
    for (auto& th : threads) th.join();
    throw;
  }
  while (started.load() < nclients) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(std::chrono::duration<double>(opt.warmup));
  double server_cpu0 = processCpuSeconds(server.child->pid());
  double client_cpu0 = selfCpuSeconds();
  auto t0 = Clock::now();
  int expected = kWarmup;
  phase.compare_exchange_strong(expected, kMeasure);
  std::this_thread::sleep_for(std::chrono::duration<double>(opt.seconds));
  auto t1 = Clock::now();
  phase.store(kStop);
  double server_cpu = processCpuSeconds(server.child->pid()) - server_cpu0;
  double client_cpu = selfCpuSeconds() - client_cpu0;
  for (auto& th : threads) th.join();
  clients.clear();

  uint64_t adds = 0;
  for (auto& r : results) {
    if (!r.error.empty())
      throw std::runtime_error(server.name + " server, " + std::to_string(nclients) +
                               " clients: " + r.error);
    adds += r.adds_done;
  }
  int64_t final_count = server.control->add(counter, 0);
  if (final_count != static_cast<int64_t>(adds)) {
    throw std::runtime_error(server.name + " server: shared counter is " +
                             std::to_string(final_count) + " after " + std::to_string(adds) +
                             " adds");
  }

  MixedRun out;
  std::vector<uint32_t> all;
  for (int op = 0; op < kNumOps; ++op) {
    std::vector<uint32_t> v;
    for (auto& r : results) v.insert(v.end(), r.lat[op].begin(), r.lat[op].end());
    all.insert(all.end(), v.begin(), v.end());
    out.p50_us[op] = percentileUs(v, 50);
    out.p99_us[op] = percentileUs(v, 99);
  }
  out.ops = all.size();
  out.ops_per_s = static_cast<double>(all.size()) / secondsSince(t0, t1);
  double nops = static_cast<double>(std::max<size_t>(all.size(), 1));
  out.server_cpu_us_per_op = server_cpu * 1e6 / nops;
  out.client_cpu_us_per_op = client_cpu * 1e6 / nops;
  out.p50_us[kAll] = percentileUs(all, 50);
  out.p99_us[kAll] = percentileUs(all, 99);
  return out;
}

// ------------------------------------------------------------------------------------------
// Connect storm

struct NetCounters {
  uint64_t listen_overflows = 0;
  uint64_t listen_drops = 0;
  uint64_t syncookies_sent = 0;
};

// TcpExt counters of this network namespace (0 when unreadable).
NetCounters readNetCounters() {
  NetCounters c;
  std::ifstream f("/proc/net/netstat");
  std::string header, values;
  while (std::getline(f, header) && std::getline(f, values)) {
    if (header.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream hs(header), vs(values);
    std::string name, val;
    hs >> name;
    vs >> val;
    while (hs >> name && vs >> val) {
      uint64_t v = std::strtoull(val.c_str(), nullptr, 10);
      if (name == "ListenOverflows") c.listen_overflows = v;
      if (name == "ListenDrops") c.listen_drops = v;
      if (name == "SyncookiesSent") c.syncookies_sent = v;
    }
  }
  return c;
}

struct StormRun {
  double ms = 0;
  double connect_p50_ms = 0;
  double connect_p99_ms = 0;
  double connect_max_ms = 0;
  uint64_t refused = 0;          // connect() failed (ECONNREFUSED, EAGAIN, ...)
  uint64_t reset = 0;            // closed or reset before the reply
  uint64_t reset_after_add = 0;  // of those, after ADD had been sent (may double count)
  uint64_t slow_connects = 0;    // connects over 900 ms: a dropped SYN was retransmitted
  NetCounters net;               // deltas
  double server_cpu_ms = 0;      // the server process's CPU time during the storm (schedstat)
};

class Storm {
 public:
  Storm(uint16_t port, int n, wire::Dialect dialect)
      : port_(port), n_(n), dialect_(dialect), conns_(static_cast<size_t>(n)) {
    wire::Request add;
    add.type = wire::QueryType::ADD;
    add.keys = {"init/"};
    add.integer = 1;
    wire::encodeRequest(dialect_, add, &add_bytes_);
  }
  ~Storm() {
    closeAll();
    if (ep_ >= 0) ::close(ep_);
  }
  Storm(const Storm&) = delete;
  Storm& operator=(const Storm&) = delete;

  StormRun run(std::chrono::milliseconds timeout) {
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) throw std::runtime_error("epoll_create1: " + std::string(std::strerror(errno)));
    NetCounters before = readNetCounters();
    start_ = Clock::now();
    auto give_up = start_ + timeout;
    size_t next_new = 0;
    std::vector<epoll_event> events(1024);
    constexpr size_t kBatch = 64;  // new connects between two looks at the replies
    while (done_ < n_) {
      auto now = Clock::now();
      if (now > give_up) {
        throw std::runtime_error("storm of " + std::to_string(n_) + ": only " +
                                 std::to_string(done_) + " clients done after " +
                                 std::to_string(timeout.count()) + " ms");
      }
      for (size_t k = 0; k < kBatch && next_new < conns_.size(); ++k) startConnect(next_new++);
      while (!retries_.empty() && retries_.top().first <= now) {
        size_t i = retries_.top().second;
        retries_.pop();
        startConnect(i);
      }
      int wait_ms = 100;
      if (next_new < conns_.size()) {
        wait_ms = 0;
      } else if (!retries_.empty()) {
        auto until = std::chrono::duration_cast<std::chrono::milliseconds>(retries_.top().first -
                                                                           Clock::now())
                         .count();
        wait_ms = static_cast<int>(std::clamp<int64_t>(until + 1, 0, 100));
      }
      int k = ::epoll_wait(ep_, events.data(), static_cast<int>(events.size()), wait_ms);
      if (k < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error("epoll_wait: " + std::string(std::strerror(errno)));
      }
      for (int e = 0; e < k; ++e)
        handle(events[static_cast<size_t>(e)].data.u32, events[static_cast<size_t>(e)].events);
    }
    StormRun r = stats_;
    r.ms = std::chrono::duration<double, std::milli>(last_done_ - start_).count();
    std::vector<double> connect_ms;
    connect_ms.reserve(conns_.size());
    for (auto& c : conns_) connect_ms.push_back(c.connect_ms);
    std::sort(connect_ms.begin(), connect_ms.end());
    auto pct = [&](double p) {
      size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(n_)));
      return connect_ms[std::min(std::max<size_t>(rank, 1), connect_ms.size()) - 1];
    };
    r.connect_p50_ms = pct(50);
    r.connect_p99_ms = pct(99);
    r.connect_max_ms = connect_ms.back();
    for (double m : connect_ms) r.slow_connects += m > 900 ? 1 : 0;
    NetCounters after = readNetCounters();
    r.net.listen_overflows = after.listen_overflows - before.listen_overflows;
    r.net.listen_drops = after.listen_drops - before.listen_drops;
    r.net.syncookies_sent = after.syncookies_sent - before.syncookies_sent;
    return r;
  }

  // Closes every connection with an RST (SO_LINGER 0), leaving no TIME_WAIT behind.
  void closeAll() {
    for (auto& c : conns_) closeFd(&c);
  }

 private:
  enum State { kIdle, kConnecting, kPing, kAdd, kDone };
  struct Conn {
    int fd = -1;
    State state = kIdle;
    int attempts = 0;
    Bytes out;
    size_t out_pos = 0;
    std::array<uint8_t, 8> in{};
    size_t in_got = 0;
    Clock::time_point connect_start;
    double connect_ms = 0;
  };

  static void closeFd(Conn* c) {
    if (c->fd < 0) return;
    linger l{1, 0};
    ::setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(c->fd);
    c->fd = -1;
  }

  void startConnect(size_t i) {
    Conn& c = conns_[i];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      throw std::runtime_error("socket: " + std::string(std::strerror(errno)) +
                               " (is RLIMIT_NOFILE high enough?)");
    }
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c.connect_start = Clock::now();
    c.state = kConnecting;
    int rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    if (rc != 0 && errno != EINPROGRESS) {
      ++stats_.refused;
      retry(i);
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(i);
    if (::epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev) != 0) {
      throw std::runtime_error("epoll_ctl: " + std::string(std::strerror(errno)));
    }
    if (rc == 0) onConnected(i);
  }

  void retry(size_t i) {
    Conn& c = conns_[i];
    if (c.state == kAdd && c.out_pos > 0) ++stats_.reset_after_add;
    closeFd(&c);
    c.state = kIdle;
    if (++c.attempts > 100) {
      throw std::runtime_error("storm: client " + std::to_string(i) + " failed 100 times");
    }
    // Exponential backoff from 1 ms, at most 64 ms, with jitter.
    int64_t base = int64_t{1} << std::min(c.attempts - 1, 6);
    std::uniform_int_distribution<int64_t> jitter(base * 500, base * 1000);
    retries_.emplace(Clock::now() + std::chrono::microseconds(jitter(rng_)), i);
  }

  void onConnected(size_t i) {
    Conn& c = conns_[i];
    c.connect_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - c.connect_start).count();
    c.out.clear();
    c.out_pos = 0;
    c.in_got = 0;
    if (dialect_ == wire::Dialect::kV2) {
      wire::Request validate;
      validate.type = wire::QueryType::VALIDATE;
      validate.u32 = wire::kValidationMagic;
      wire::Request ping;
      ping.type = wire::QueryType::PING;
      ping.u32 = static_cast<uint32_t>(i);
      wire::encodeRequest(wire::Dialect::kV2, validate, &c.out);
      wire::encodeRequest(wire::Dialect::kV2, ping, &c.out);
      c.state = kPing;
    } else {
      c.out = add_bytes_;
      c.state = kAdd;
    }
    sendPending(i);
  }

  // Writes what is left of c.out; arms EPOLLOUT only while some of it is stuck.
  void sendPending(size_t i) {
    Conn& c = conns_[i];
    while (c.out_pos < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_pos += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      ++stats_.reset;
      retry(i);
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | (c.out_pos < c.out.size() ? EPOLLOUT : 0u);
    ev.data.u32 = static_cast<uint32_t>(i);
    ::epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void handle(size_t i, uint32_t events) {
    Conn& c = conns_[i];
    if (c.fd < 0) return;
    if (c.state == kConnecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        ++stats_.refused;
        retry(i);
        return;
      }
      if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0) onConnected(i);
      return;
    }
    if ((events & EPOLLOUT) != 0 && c.out_pos < c.out.size()) {
      sendPending(i);
      if (conns_[i].fd < 0) return;
    }
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) == 0) return;
    size_t need = c.state == kPing ? 4 : 8;
    while (c.in_got < need) {
      ssize_t n = ::recv(c.fd, c.in.data() + c.in_got, need - c.in_got, 0);
      if (n > 0) {
        c.in_got += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      ++stats_.reset;
      retry(i);
      return;
    }
    if (c.state == kPing) {
      if (wire::loadU32(c.in.data()) != static_cast<uint32_t>(i)) {
        throw std::runtime_error("storm: PING echoed a wrong nonce");
      }
      c.out = add_bytes_;
      c.out_pos = 0;
      c.in_got = 0;
      c.state = kAdd;
      sendPending(i);
      return;
    }
    auto v = static_cast<int64_t>(wire::loadU64(c.in.data()));
    if (v < 1) throw std::runtime_error("storm: ADD init/ returned " + std::to_string(v));
    c.state = kDone;
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, c.fd, nullptr);
    ++done_;
    last_done_ = Clock::now();
  }

  uint16_t port_;
  int n_;
  wire::Dialect dialect_;
  std::vector<Conn> conns_;
  Bytes add_bytes_;
  int ep_ = -1;
  int done_ = 0;
  Clock::time_point start_;
  Clock::time_point last_done_;
  StormRun stats_;
  std::mt19937 rng_{12345};
  using Retry = std::pair<Clock::time_point, size_t>;
  std::priority_queue<Retry, std::vector<Retry>, std::greater<Retry>> retries_;
};

StormRun runStorm(Server& server, int n, wire::Dialect dialect) {
  server.checkAlive();
  server.control->deleteKey("init/");
  StormRun r;
  {
    Storm storm(server.port, n, dialect);
    double cpu0 = processCpuSeconds(server.child->pid());
    r = storm.run(120s);
    r.server_cpu_ms = (processCpuSeconds(server.child->pid()) - cpu0) * 1e3;
    int64_t count = server.control->add("init/", 0);
    if (count != n) {
      throw std::runtime_error(server.name + " server: init/ is " + std::to_string(count) +
                               " after a storm of " + std::to_string(n) + " clients");
    }
  }  // closes all storm connections
  // Let the server take the disconnects before the next measurement.
  std::this_thread::sleep_for(300ms);
  server.control->add("init/", 0);
  server.checkAlive();
  return r;
}

// ------------------------------------------------------------------------------------------
// Reporting

std::string fmt(double v, int decimals = 1) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

struct ResultLine {
  std::string name;
  double value;
  std::string unit;
  double peer;
  int decimals;
};

std::vector<ResultLine> g_results;

void addResult(const std::string& name, double value, const std::string& unit, double peer,
               int decimals) {
  g_results.push_back({name, value, unit, peer, decimals});
}

std::string loadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

int benchMain(const Options& opt) {
  // Descriptors: storm connections + mixed clients + slack.
  int max_storm = opt.storm.empty() ? 0 : *std::max_element(opt.storm.begin(), opt.storm.end());
  int max_clients =
      opt.clients.empty() ? 0 : *std::max_element(opt.clients.begin(), opt.clients.end());
  cpprun::raiseOpenFileLimit();
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  rlim_t need = static_cast<rlim_t>(std::max(max_storm, max_clients)) + 64;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < need) {
    std::fprintf(stderr,
                 "store_bench: RLIMIT_NOFILE is %llu (hard limit %llu), this run needs about "
                 "%llu descriptors; raise 'ulimit -Hn' or use smaller --storm/--clients\n",
                 static_cast<unsigned long long>(lim.rlim_cur),
                 static_cast<unsigned long long>(lim.rlim_max),
                 static_cast<unsigned long long>(need));
    return 2;
  }
  if (opt.torch2 && ::access(opt.torch2_python.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "store_bench: the torch %s peer needs %s (%s); install it with "
                 "packaging/setup.sh, pass --torch2-python, or leave it out with --peers\n",
                 CPPRUN_TORCH2_VERSION, opt.torch2_python.c_str(), std::strerror(errno));
    return 1;
  }
  if (opt.torch113 && ::access(kPython, X_OK) != 0) {
    std::fprintf(stderr, "store_bench: the torch 1.13 peer needs %s (%s)\n", kPython,
                 std::strerror(errno));
    return 1;
  }

  utsname uts{};
  ::uname(&uts);
  const unsigned cpus = std::thread::hardware_concurrency();
  std::printf("store_bench: ours = %s\n", opt.daemon.c_str());
  if (opt.torch2) {
    std::printf(
        "  peer libuv = torch %s TCPStore, libuv server (%s %s --backend libuv --listen %s)\n",
        CPPRUN_TORCH2_VERSION, opt.torch2_python.c_str(), opt.torch_script.c_str(),
        opt.torch2_listen.c_str());
  }
  if (opt.torch113) {
    std::printf("  peer t1.13 = torch 1.13 TCPStore, legacy server (%s %s)\n", kPython,
                opt.torch_script.c_str());
  }
  std::printf("host: %s %s, %u CPUs online, load average %s, RLIMIT_NOFILE %llu\n", uts.sysname,
              uts.release, cpus, loadAverage().c_str(),
              static_cast<unsigned long long>(lim.rlim_cur));
  std::printf(
      "client: TcpStoreClient on %s: 2.2+ dialect against ours (ours-v2) and libuv, legacy "
      "dialect against ours and t1.13;\n%d run(s) per configuration, variants alternating%s\n\n",
      kHost, opt.runs, opt.quick ? " (--quick)" : "");
  std::fflush(stdout);

  // The long-running servers (never moved: variants point at them).
  Server ours;
  ours.name = "ours";
  ours.kind = ServerKind::kOurs;
  Server torch2;
  torch2.name = "libuv";
  torch2.kind = ServerKind::kTorch2;
  Server torch113;
  torch113.name = "t1.13";
  torch113.kind = ServerKind::kTorch113;
  std::vector<Server*> servers{&ours};
  if (opt.torch2) servers.push_back(&torch2);
  if (opt.torch113) servers.push_back(&torch113);

  // What is measured: a server driven in a dialect. Comparisons pair two of them.
  struct Variant {
    std::string label;
    Server* server;
    wire::Dialect dialect;
  };
  struct Comparison {
    std::string ours;    // variant label
    std::string peer;    // variant label
    std::string suffix;  // of the RESULT names
  };
  std::vector<Variant> variants;
  std::vector<Comparison> comparisons;
  if (opt.torch2) {
    variants.push_back({"ours-v2", &ours, wire::Dialect::kV2});
    variants.push_back({"libuv", &torch2, wire::Dialect::kV2});
    comparisons.push_back({"ours-v2", "libuv", ""});
  }
  if (opt.torch113) {
    variants.push_back({"ours", &ours, wire::Dialect::kLegacy});
    variants.push_back({"t1.13", &torch113, wire::Dialect::kLegacy});
    comparisons.push_back({"ours", "t1.13", "_t113"});
  }
  if (comparisons.empty()) {
    std::fprintf(stderr, "store_bench: --peers selected no peer\n");
    return 2;
  }

  auto t_start = Clock::now();
  for (Server* s : servers) launch(s, opt);
  for (Server* s : servers) ready(s);
  std::printf("servers:");
  for (Server* s : servers) {
    std::printf(" %s pid %d port %u;", s->name.c_str(), static_cast<int>(s->child->pid()), s->port);
  }
  std::printf(" up in %.1f s\n\n", secondsSince(t_start, Clock::now()));
  std::fflush(stdout);

  // ---- Mixed workload
  std::map<std::string, std::map<int, std::vector<MixedRun>>> mixed;  // label -> clients -> runs
  if (!opt.clients.empty()) {
    std::printf(
        "== Mixed workload: per iteration set own key, get it (WAIT+GET), add shared "
        "counter, wait existing key, compareSet own key\n");
    std::printf("   %.2f s measured after %.2f s warm-up per run\n", opt.seconds, opt.warmup);
  }
  int run_id = 0;
  for (int c : opt.clients) {
    for (int r = 0; r < opt.runs; ++r) {
      for (size_t k = 0; k < variants.size(); ++k) {
        const Variant& v = variants[(k + static_cast<size_t>(r)) % variants.size()];
        MixedRun m = runMixed(*v.server, v.dialect, c, opt, run_id++);
        mixed[v.label][c].push_back(m);
        std::printf(
            "   run %d/%d  %-7s  %4d clients  %10.0f ops/s  p50 %8.1f us  p99 %9.1f us  "
            "cpu/op: server %.1f us, client %.1f us\n",
            r + 1, opt.runs, v.label.c_str(), c, m.ops_per_s, m.p50_us[kAll], m.p99_us[kAll],
            m.server_cpu_us_per_op, m.client_cpu_us_per_op);
        std::fflush(stdout);
      }
    }
  }

  // ---- Connect storm
  // Warm: against the servers of the mixed workload (which have served storms before);
  // cold: against a freshly started server each time, as a store sees at job start.
  using StormMap = std::map<std::pair<int, std::string>, std::vector<StormRun>>;
  StormMap storms;       // warm
  StormMap cold_storms;  // fresh server per storm
  auto printStorm = [&](int r, const std::string& label, int n, const StormRun& st,
                        const std::string& extra) {
    std::printf(
        "   run %d/%d  %-7s  %5d clients  %8.1f ms  server cpu %6.1f ms  connect p50 %.2f "
        "p99 %.2f max %.1f ms  refused %llu reset %llu slow-connects %llu "
        "listen-overflows %llu%s\n",
        r + 1, opt.runs, label.c_str(), n, st.ms, st.server_cpu_ms, st.connect_p50_ms,
        st.connect_p99_ms, st.connect_max_ms, static_cast<unsigned long long>(st.refused),
        static_cast<unsigned long long>(st.reset),
        static_cast<unsigned long long>(st.slow_connects),
        static_cast<unsigned long long>(st.net.listen_overflows), extra.c_str());
    std::fflush(stdout);
  };
  if (!opt.storm.empty()) {
    std::printf(
        "\n== Connect storm (warm): N clients (one epoll thread) connect, handshake, ADD init/ 1, "
        "against the long-running servers\n");
  }
  for (int n : opt.storm) {
    for (int r = 0; r < opt.runs; ++r) {
      for (size_t k = 0; k < variants.size(); ++k) {
        const Variant& v = variants[(k + static_cast<size_t>(r)) % variants.size()];
        StormRun st = runStorm(*v.server, n, v.dialect);
        storms[{n, v.label}].push_back(st);
        printStorm(r, v.label, n, st, "");
      }
    }
  }
  if (!opt.storm.empty()) {
    std::printf("\n== Connect storm (cold): the same, each against a freshly started server\n");
  }
  for (int n : opt.storm) {
    for (int r = 0; r < opt.runs; ++r) {
      for (size_t k = 0; k < variants.size(); ++k) {
        const Variant& v = variants[(k + static_cast<size_t>(r)) % variants.size()];
        Server fresh;
        fresh.name = v.server->name;
        fresh.kind = v.server->kind;
        launch(&fresh, opt);
        ready(&fresh);
        StormRun st = runStorm(fresh, n, v.dialect);
        cold_storms[{n, v.label}].push_back(st);
        std::string how = shutdown(&fresh);
        printStorm(r, v.label, n, st, how == "exit status 0" ? "" : "  (server: " + how + ")");
      }
    }
  }

  // ---- Tables
  std::printf("\n== Summary (medians of %d run(s); latency in microseconds; get = WAIT+GET)\n",
              opt.runs);
  if (!opt.clients.empty()) {
    std::printf("%-8s %-8s %12s %9s %9s %11s %11s", "clients", "server", "ops/s", "p50", "p99",
                "srv-cpu/op", "cli-cpu/op");
    for (int op = 0; op < kNumOps; ++op) {
      std::printf("  %4s p50/p99   ", kOpNames[op]);
    }
    std::printf("\n");
  }
  auto medCpu = [](const std::vector<MixedRun>& v, bool server) {
    std::vector<double> x;
    for (auto& m : v) x.push_back(server ? m.server_cpu_us_per_op : m.client_cpu_us_per_op);
    return median(x);
  };
  auto medOps = [](const std::vector<MixedRun>& v) {
    std::vector<double> x;
    for (auto& m : v) x.push_back(m.ops_per_s);
    return median(x);
  };
  auto medLat = [](const std::vector<MixedRun>& v, int op, bool p99) {
    std::vector<double> x;
    for (auto& m : v)
      x.push_back(p99 ? m.p99_us[static_cast<size_t>(op)] : m.p50_us[static_cast<size_t>(op)]);
    return median(x);
  };
  for (int c : opt.clients) {
    for (const Variant& var : variants) {
      const auto& v = mixed[var.label][c];
      std::printf("%-8d %-8s %12.0f %9.1f %9.1f %11.1f %11.1f", c, var.label.c_str(), medOps(v),
                  medLat(v, kAll, false), medLat(v, kAll, true), medCpu(v, true), medCpu(v, false));
      for (int op = 0; op < kNumOps; ++op) {
        std::printf("  %7s/%-8s", fmt(medLat(v, op, false)).c_str(),
                    fmt(medLat(v, op, true)).c_str());
      }
      std::printf("\n");
    }
    for (const Comparison& cmp : comparisons) {
      const auto& o = mixed[cmp.ours][c];
      const auto& p = mixed[cmp.peer][c];
      std::printf(
          "%-8d ratio %-8s %6.2fx %8.2fx %8.2fx %10.2fx   (ops/s, p50, p99, srv-cpu/op: %s/%s)\n",
          c, cmp.peer.c_str(), medOps(o) / medOps(p),
          medLat(o, kAll, false) / medLat(p, kAll, false),
          medLat(o, kAll, true) / medLat(p, kAll, true), medCpu(o, true) / medCpu(p, true),
          cmp.ours.c_str(), cmp.peer.c_str());
    }
  }
  for (const Comparison& cmp : comparisons) {
    for (int c : opt.clients) {
      const auto& o = mixed[cmp.ours][c];
      const auto& p = mixed[cmp.peer][c];
      std::string base = "mixed_c" + std::to_string(c) + "_";
      const std::string& sfx = cmp.suffix;
      addResult(base + "ops_per_s" + sfx, medOps(o), "ops/s", medOps(p), 0);
      addResult(base + "p50_us" + sfx, medLat(o, kAll, false), "us", medLat(p, kAll, false), 1);
      addResult(base + "p99_us" + sfx, medLat(o, kAll, true), "us", medLat(p, kAll, true), 1);
      addResult(base + "server_cpu_us_per_op" + sfx, medCpu(o, true), "us", medCpu(p, true), 2);
      for (int op = 0; op < kNumOps; ++op) {
        for (bool p99 : {false, true}) {
          addResult(base + kOpNames[op] + (p99 ? "_p99_us" : "_p50_us") + sfx, medLat(o, op, p99),
                    "us", medLat(p, op, p99), 1);
        }
      }
    }
  }
  auto medStorm = [](StormMap& m, int n, const std::string& label, bool cpu) {
    std::vector<double> x;
    for (auto& st : m[{n, label}]) x.push_back(cpu ? st.server_cpu_ms : st.ms);
    return median(x);
  };
  for (int pass = 0; pass < 2 && !opt.storm.empty(); ++pass) {
    StormMap& m = pass == 0 ? storms : cold_storms;
    std::printf("\n%-8s %-8s %10s %14s %14s %8s %8s %14s %16s\n", pass == 0 ? "storm" : "cold",
                "server", "total ms", "server cpu ms", "connect p99ms", "refused", "resets",
                "slow-connects", "listen-overflows");
    for (int n : opt.storm) {
      for (const auto& v : variants) {
        const auto& runs = m[{n, v.label}];
        std::vector<double> p99;
        uint64_t refused = 0, reset = 0, slow = 0, overflow = 0;
        for (auto& st : runs) {
          p99.push_back(st.connect_p99_ms);
          refused += st.refused;
          reset += st.reset;
          slow += st.slow_connects;
          overflow += st.net.listen_overflows;
        }
        std::printf("%-8d %-8s %10.1f %14.1f %14.2f %8llu %8llu %14llu %16llu\n", n,
                    v.label.c_str(), medStorm(m, n, v.label, false), medStorm(m, n, v.label, true),
                    median(p99), static_cast<unsigned long long>(refused),
                    static_cast<unsigned long long>(reset), static_cast<unsigned long long>(slow),
                    static_cast<unsigned long long>(overflow));
      }
    }
  }
  for (const Comparison& cmp : comparisons) {
    for (int pass = 0; pass < 2; ++pass) {
      StormMap& m = pass == 0 ? storms : cold_storms;
      for (int n : opt.storm) {
        std::string base = "storm_" + std::to_string(n) + (pass == 0 ? "" : "_cold");
        addResult(base + cmp.suffix + "_ms", medStorm(m, n, cmp.ours, false), "ms",
                  medStorm(m, n, cmp.peer, false), 1);
        addResult(base + cmp.suffix + "_server_cpu_ms", medStorm(m, n, cmp.ours, true), "ms",
                  medStorm(m, n, cmp.peer, true), 1);
      }
    }
  }
  if (!opt.storm.empty()) {
    std::printf(
        "(storm = warm servers, cold = a fresh server per storm; refused/resets/slow-connects/"
        "listen-overflows: totals over all runs;\n ours-v2 and libuv: VALIDATE+PING handshake "
        "first; ours and t1.13: none; slow-connects = connects over 900 ms, i.e. a dropped SYN)\n");
  }

  // ---- Targets (information only), against the first comparison (torch 2.x when present)
  const Comparison& anchor = comparisons.front();
  std::printf("\n== Targets (information, not enforced; %s against %s)\n", anchor.ours.c_str(),
              anchor.peer.c_str());
  auto target = [](const std::string& what, bool measured, bool pass, const std::string& detail) {
    std::printf("   %-52s %s  %s\n", what.c_str(),
                !measured ? "NOT MEASURED"
                : pass    ? "PASS"
                          : "FAIL",
                detail.c_str());
  };
  const auto& o64 = mixed[anchor.ours][64];
  const auto& p64 = mixed[anchor.peer][64];
  bool have64 = !o64.empty() && !p64.empty();
  double r64 = have64 ? medOps(o64) / medOps(p64) : 0;
  double l64 = have64 ? medLat(o64, kAll, true) / medLat(p64, kAll, true) : 0;
  double cpu64 = have64 ? medCpu(o64, true) / medCpu(p64, true) : 0;
  target("64 clients: ops/s >= 2x " + anchor.peer, have64, r64 >= 2.0, "ratio " + fmt(r64, 2));
  target("64 clients: p99 <= 0.5x " + anchor.peer, have64, l64 <= 0.5, "ratio " + fmt(l64, 2));
  std::printf("   %-52s %s\n", ("64 clients: server CPU per op vs " + anchor.peer).c_str(),
              have64 ? ("ratio " + fmt(cpu64, 2)).c_str() : "NOT MEASURED");
  bool have4096 = !storms[{4096, anchor.ours}].empty() && !storms[{4096, anchor.peer}].empty();
  for (int pass = 0; pass < 2; ++pass) {
    StormMap& m = pass == 0 ? storms : cold_storms;
    const char* which = pass == 0 ? "warm" : "cold";
    double so = have4096 ? medStorm(m, 4096, anchor.ours, false) : 0;
    double sp = have4096 ? medStorm(m, 4096, anchor.peer, false) : 0;
    target(std::string("4096-client storm (") + which + ") <= 0.5x " + anchor.peer, have4096,
           so <= 0.5 * sp, fmt(so) + " ms vs " + fmt(sp) + " ms, ratio " + fmt(so / sp, 2));
    target(std::string("4096-client storm (") + which + ", " + anchor.ours + ") < 1000 ms",
           have4096, so < 1000.0, fmt(so) + " ms");
  }
  if (cpus <= 4) {
    std::printf(
        "   note: %u CPUs shared by the client threads and the server: ops/s and p99 ratios are\n"
        "   bounded by the client's own CPU cost; the server CPU per op ratio is the server's.\n",
        cpus);
  }

  std::printf("\n");
  for (const auto& r : g_results) {
    std::printf("RESULT %s %s %s peer=%s ratio=%s\n", r.name.c_str(),
                fmt(r.value, r.decimals).c_str(), r.unit.c_str(), fmt(r.peer, r.decimals).c_str(),
                fmt(r.value / r.peer, 2).c_str());
  }
  std::fflush(stdout);

  std::printf("\nservers stopped:");
  for (Server* s : servers) std::printf(" %s %s;", s->name.c_str(), shutdown(s).c_str());
  std::printf(" total %.1f s\n", secondsSince(t_start, Clock::now()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parseFlags(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = onFatalSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  try {
    return benchMain(opt);
  } catch (const std::exception& e) {
    // The Child destructors have run by now: every server is stopped and reaped.
    std::fflush(stdout);
    std::fprintf(stderr, "store_bench: error: %s\n", e.what());
    return 1;
  }
}
