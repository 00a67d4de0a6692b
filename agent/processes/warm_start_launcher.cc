#include "agent/processes/warm_start_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "agent/processes/spawn_plan.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/system.h"

extern char** environ;

namespace cpprun::agent {

namespace {

const char* const kWarmProcessModule =
#include "agent/processes/warm_process_module.py.inc"
    ;

// The interpreter-wide variables of an environment as execve takes it ("NAME=value").
std::map<std::string, std::string> interpreterWideOf(const std::vector<std::string>& env) {
  std::map<std::string, std::string> wide;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    if (interpreterWideVariable(name)) wide[std::move(name)] = entry.substr(eq + 1);
  }
  return wide;
}

struct FileStamp {
  bool exists = false;
  long long mtime_ns = 0;
  long long size = 0;
  bool operator!=(const FileStamp& other) const {
    return exists != other.exists || mtime_ns != other.mtime_ns || size != other.size;
  }
};

FileStamp stampOf(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {};
  return {true, static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
          static_cast<long long>(st.st_size)};
}

// VmRSS of `pid` in KiB; 0 when it cannot be read.
long rssKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

std::string randomHex() {
  std::random_device device;
  char text[17];
  std::snprintf(text, sizeof text, "%08x%08x", device(), device());
  return text;
}

}  // namespace

struct WarmStartLauncher::Impl : std::enable_shared_from_this<WarmStartLauncher::Impl> {
  Impl(boost::asio::io_context& io, std::unique_ptr<ProcessLauncher> cold, WarmStartOptions options,
       OnReady on_ready)
      : io_(io),
        cold_(std::move(cold)),
        options_(std::move(options)),
        on_ready_(std::move(on_ready)) {}
  ~Impl() {
    const pid_t pid = warm_.pid;
    stopWarm();
    if (pid > 0) reap(pid);
    if (dev_null_ >= 0) ::close(dev_null_);
  }

  Result<pid_t> spawn(const ProcessSpec& spec) {
    const std::string ineligible = warmIneligibility(spec.argv);
    if (!ineligible.empty()) {
      sayOnce("cold starts: " + ineligible);
      return cold_->spawn(spec);
    }
    readMessages();
    if (warm_.pid > 0 && warm_.ready) {
      bool fatal = false;
      std::string reason;
      // One plan for the checks and the request: the environment a cold start would get.
      Status devnull = ensureDevNull();
      Result<SpawnPlan> plan =
          devnull.isOk() ? prepareSpawn(spec, environ, dev_null_) : Result<SpawnPlan>(devnull);
      if (!plan.isOk()) {
        reason = plan.status().message();  // the cold spawn says it too
      } else {
        reason = mismatch(spec, plan.value(), &fatal);
        if (reason.empty()) {
          Result<pid_t> pid = warmSpawn(spec, plan.value(), &reason, &fatal);
          if (pid.isOk()) return pid;
        }
      }
      sayOnce("a cold start instead of a warm one: " + reason);
      if (fatal) stopWarm();
    } else if (warm_.pid > 0 && !firstAttempt(spec)) {  // attempt 0 is cold by design
      sayOnce("a cold start: the warm process has not imported the workers' packages yet");
    }
    if (warm_.pid <= 0 && starts_left_ > 0) startWarm(spec);
    if (warm_.pid > 0 && !warm_.ready) {
      ProcessSpec recorded = spec;
      recorded.env["CPPRUN_WARM_RECORD"] = warm_.record_name;
      return cold_->spawn(recorded);
    }
    return cold_->spawn(spec);
  }

  size_t killAdoptedOrphans(const std::vector<pid_t>& known) {
    std::vector<pid_t> keep = known;
    if (warm_.pid > 0) keep.push_back(warm_.pid);
    return cold_->killAdoptedOrphans(keep);
  }

  void prewarm(const std::vector<std::string>& modules) {
    if (options_.spare_like.argv.empty() || !warmIneligibility(options_.spare_like.argv).empty()) {
      return;
    }
    if (warm_.pid <= 0 && starts_left_ > 0) startWarm(options_.spare_like);
    if (warm_.pid <= 0 || warm_.ready || warm_.preloading) return;
    const std::string text = nlohmann::json({{"op", "preload"}, {"modules", modules}}).dump();
    if (::send(warm_.socket, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
      sayOnce("the job's modules cannot be sent to the warm process: " + errnoText(errno));
      return;
    }
    warm_.preloading = true;
    CPPRUN_LOG(kInfo) << "--warm-restart: warm process " << warm_.pid << " pre-imports the "
                      << modules.size() << " modules the job's workers hold";
  }

  struct Warm {
    pid_t pid = -1;
    int socket = -1;  // ours: SOCK_SEQPACKET, non-blocking
    bool ready = false;
    long ready_rss_kib = 0;
    std::string python;
    std::string program;  // the script (empty for -m)
    FileStamp program_stamp;
    std::map<std::string, std::string> wide;  // its interpreter-wide variables
    std::string record_name;
    bool preloading = false;  // sent the job's modules (prewarm)
  };

  // Each reason once in the log (a job restarts many times; the log says it at the first).
  void sayOnce(const std::string& text) {
    if (said_.insert(text).second) {
      CPPRUN_LOG(kInfo) << "--warm-restart: " << text;
    }
  }

  static bool firstAttempt(const ProcessSpec& spec) {
    auto count = spec.env.find("TORCHELASTIC_RESTART_COUNT");
    return count == spec.env.end() || count->second == "0";
  }

  Status ensureDevNull() {
    if (dev_null_ >= 0) return Status::ok();
    dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    return dev_null_ >= 0 ? Status::ok()
                          : internalError("cannot open /dev/null: " + errnoText(errno));
  }

  // Starts the warm process with `spec`'s interpreter and interpreter-wide environment; it waits
  // for the record the cold workers of this spawn will send.
  void startWarm(const ProcessSpec& spec) {
    --starts_left_;
    if (Status s = ensureDevNull(); !s.isOk()) {
      sayOnce("no warm process: " + s.message());
      return;
    }
    Result<SpawnPlan> plan = prepareSpawn(spec, environ, dev_null_);
    if (!plan.isOk()) return;  // the cold spawn reports it
    std::error_code ec;
    std::filesystem::create_directories(options_.module_dir, ec);
    const std::string module = options_.module_dir + "/cpprun_warm.py";
    if (Status s = writeFileWhole(module, warmProcessModule()); !s.isOk()) {
      return sayOnce("no warm process: " + s.message());
    }
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) {
      return sayOnce("no warm process: socketpair: " + errnoText(errno));
    }
    const std::string log_path = options_.module_dir + "/cpprun_warm.log";
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    Warm warm;
    warm.record_name = "cpprun-warm-" + std::to_string(::getpid()) + "-" + randomHex();
    warm.python = spec.argv[0];
    warm.program = spec.argv[2] == "-m" ? "" : spec.argv[2];
    warm.program_stamp = stampOf(warm.program);
    warm.wide = interpreterWideOf(plan.value().env);
    ProcessSpec process;
    process.argv = {spec.argv[0], module, std::to_string(::getpid()), warm.record_name};
    // The agent's environment and the worker's interpreter-wide variables; no worker identity.
    for (const auto& [name, value] : spec.env) {
      if (interpreterWideVariable(name)) process.env[name] = value;
    }
    process.stdin_fd = ends[1];
    process.stdout_fd = log;
    process.stderr_fd = log;
    Result<pid_t> pid = cold_->spawn(process);
    ::close(ends[1]);
    if (log >= 0) ::close(log);
    if (!pid.isOk()) {
      ::close(ends[0]);
      return sayOnce("no warm process: " + pid.status().message());
    }
    ::fcntl(ends[0], F_SETFL, ::fcntl(ends[0], F_GETFL) | O_NONBLOCK);
    warm.pid = pid.value();
    warm.socket = ends[0];
    warm_ = std::move(warm);
    watch();
    CPPRUN_LOG(kInfo) << "--warm-restart: warm process " << warm_.pid
                      << " waits for local rank 0's imports (its log: " << log_path << ")";
  }

  // Waits (at most a second) for the killed warm process to end, and reaps it: when the launcher
  // goes the agent's reaper has stopped, and an unreaped child would outlive the agent.
  static void reap(pid_t pid) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd >= 0) {
      pollfd exited{pidfd, POLLIN, 0};
      while (::poll(&exited, 1, 1000) < 0 && errno == EINTR) {
      }
      ::close(pidfd);
    }
    int status = 0;
    (void)::waitpid(pid, &status, WNOHANG);
  }

  // Reads the warm process's messages as they come (its "ready" is shared with the spares at
  // once, not at the next spawn). The descriptor watched is a copy of the socket.
  void watch() {
    const int copy = ::fcntl(warm_.socket, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return;
    watcher_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, copy);
    armWatch();
  }

  void armWatch() {
    if (!watcher_) return;
    std::weak_ptr<Impl> self = weak_from_this();
    watcher_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                         [self](const boost::system::error_code& error) {
                           auto impl = self.lock();
                           if (!impl || error) return;
                           impl->readMessages();
                           impl->armWatch();
                         });
  }

  void stopWarm() {
    if (warm_.pid <= 0) return;
    if (watcher_) {
      boost::system::error_code ignored;
      watcher_->close(ignored);
      watcher_.reset();
    }
    ::close(warm_.socket);
    (void)cold_->signalWorker(warm_.pid, false, SIGKILL);  // its group; the sentinel forgets it
    warm_ = Warm{};
  }

  // What the warm process said since last asked: "ready" or "unusable".
  void readMessages() {
    if (warm_.pid <= 0) return;
    if (messages_.empty()) messages_.resize(size_t{4} << 20);  // the largest it sends
    char* const buffer = messages_.data();
    for (;;) {
      const ssize_t n = ::recv(warm_.socket, buffer, messages_.size(), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        sayOnce("the warm process " + std::to_string(warm_.pid) + " ended (its log is in " +
                options_.module_dir + "); a new one starts");
        stopWarm();
        return;
      }
      const auto message = nlohmann::json::parse(buffer, buffer + n, nullptr, false);
      if (!message.is_object()) continue;
      const std::string event = message.value("event", "");
      if (event == "ready" && !warm_.ready) {
        warm_.ready = true;
        warm_.ready_rss_kib = message.value("rss_kib", 0L);
        if (warm_.ready_rss_kib <= 0) warm_.ready_rss_kib = rssKib(warm_.pid);
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.2f", message.value("seconds", 0.0));
        CPPRUN_LOG(kInfo) << "--warm-restart: warm process " << warm_.pid
                          << " is ready: " << message.value("modules", 0) << " modules loaded in "
                          << seconds << " s (" << message.value("skipped", 0)
                          << " not preloaded), RSS " << warm_.ready_rss_kib / 1024 << " MiB";
        if (on_ready_ && message.contains("names") && message["names"].is_array()) {
          auto names = parseWarmImportsRecord(message["names"].dump());
          if (names.isOk()) {
            on_ready_(names.value());
          } else {
            sayOnce("the warm process's modules are not shared: " + names.status().message());
          }
        }
      } else if (event == "unusable") {
        sayOnce("no warm restarts for this job: the warm process cannot fork workers safely: " +
                message.value("reason", std::string("?")));
        stopWarm();
        starts_left_ = 0;
        return;
      }
    }
  }

  // Why `spec` may not start from the warm process ("": it may); `fatal`: the warm process can
  // serve no spawn any more.
  std::string mismatch(const ProcessSpec& spec, const SpawnPlan& plan, bool* fatal) {
    *fatal = true;
    if (spec.argv[0] != warm_.python) return "the worker's interpreter is not the warm process's";
    const std::string program = spec.argv[2] == "-m" ? "" : spec.argv[2];
    if (program != warm_.program || stampOf(program) != warm_.program_stamp) {
      return "the program changed on disk";
    }
    if (std::string grown = warmProcessGrowth(warm_.ready_rss_kib, rssKib(warm_.pid), options_);
        !grown.empty()) {
      return grown;
    }
    const auto wide = interpreterWideOf(plan.env);
    for (const auto& [name, value] : wide) {
      auto it = warm_.wide.find(name);
      if (it == warm_.wide.end() || it->second != value) return name + " differs";
    }
    for (const auto& [name, value] : warm_.wide) {
      if (wide.count(name) == 0) return name + " differs";
    }
    *fatal = false;
    return "";
  }

  // Whether `pid` is a worker the warm process forked for the agent: the agent's child, or still
  // the child of a middle process the warm process forked (it is leaving; the worker is
  // re-parented to the agent, a child subreaper, when it has).
  bool agentsWorker(pid_t pid) const {
    const pid_t parent = parentOf(pid);
    if (parent == ::getpid()) return true;
    if (parent > 0 && parentOf(parent) == warm_.pid) return true;
    return parentOf(pid) == ::getpid();  // the middle left between the two reads
  }

  // Asks the warm process to fork `spec`'s worker (`plan`: its prepared spawn); waits at most
  // answer_timeout.
  Result<pid_t> warmSpawn(const ProcessSpec& spec, const SpawnPlan& plan, std::string* reason,
                          bool* fatal) {
    *fatal = true;
    const int fds[3] = {plan.stdin_fd, spec.stdout_fd >= 0 ? spec.stdout_fd : STDOUT_FILENO,
                        spec.stderr_fd >= 0 ? spec.stderr_fd : STDERR_FILENO};
    int tty = -1;
    if (spec.controlling_tty_fd >= 0) {
      tty = spec.controlling_tty_fd == fds[1] ? 1 : spec.controlling_tty_fd == fds[2] ? 2 : -1;
      if (tty < 0) {
        *reason = "its terminal is not its stdout or stderr";
        *fatal = false;
        return invalidArgument(*reason);
      }
    }
    nlohmann::json request = {{"op", "spawn"},
                              {"argv", spec.argv},
                              {"env", plan.env},
                              {"tty", tty},
                              {"cpus", spec.cpus},
                              {"mempolicy", plan.mempolicy_mode},
                              {"nodemask", plan.nodemask},
                              {"maxnode", plan.maxnode}};
    const std::string text = request.dump();
    iovec io{const_cast<char*>(text.data()), text.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof fds);
    std::memcpy(CMSG_DATA(header), fds, sizeof fds);
    if (::sendmsg(warm_.socket, &message, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
      *reason = "the warm process takes no request (" + errnoText(errno) + ")";
      return unavailable(*reason);
    }
    pollfd wait{warm_.socket, POLLIN, 0};
    int polled;
    while ((polled = ::poll(&wait, 1, static_cast<int>(options_.answer_timeout.count()))) < 0 &&
           errno == EINTR) {
    }
    char buffer[4096];
    const ssize_t n = polled > 0 ? ::recv(warm_.socket, buffer, sizeof buffer, MSG_DONTWAIT) : -1;
    if (n <= 0) {
      *reason = polled == 0 ? "the warm process did not fork within " +
                                  std::to_string(options_.answer_timeout.count()) + " ms"
                            : "the warm process ended";
      return unavailable(*reason);
    }
    const auto answer = nlohmann::json::parse(buffer, buffer + n, nullptr, false);
    if (!answer.is_object() || !answer.value("ok", false)) {
      *reason = "the warm process refused: " +
                (answer.is_object() ? answer.value("reason", std::string("?")) : "?");
      *fatal = !answer.is_object() || answer.value("final", false);
      return unavailable(*reason);
    }
    const long long pid = answer.value("pid", -1LL);
    // Only our own child is a worker: a number it names is checked, never taken on trust.
    if (pid <= 0 || pid > INT32_MAX || !agentsWorker(static_cast<pid_t>(pid))) {
      *reason = "the warm process named a process that is not the agent's child";
      return unavailable(*reason);
    }
    cold_->adopt(static_cast<pid_t>(pid));
    sayOnce("workers start warm: forked by warm process " + std::to_string(warm_.pid));
    return static_cast<pid_t>(pid);
  }

  boost::asio::io_context& io_;
  std::unique_ptr<ProcessLauncher> cold_;
  const WarmStartOptions options_;
  const OnReady on_ready_;
  Warm warm_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> watcher_;
  std::vector<char> messages_;  // readMessages' buffer, made at its first use
  int starts_left_ = 3;         // warm processes this job may start (one, and two after it ended)
  int dev_null_ = -1;
  std::set<std::string> said_;
};

WarmStartLauncher::WarmStartLauncher(boost::asio::io_context& io,
                                     std::unique_ptr<ProcessLauncher> cold,
                                     WarmStartOptions options, OnReady on_ready)
    : impl_(std::make_shared<Impl>(io, std::move(cold), std::move(options), std::move(on_ready))) {}
WarmStartLauncher::~WarmStartLauncher() = default;
Result<pid_t> WarmStartLauncher::spawn(const ProcessSpec& spec) { return impl_->spawn(spec); }
Status WarmStartLauncher::signalGroup(pid_t pgid, int signo) {
  return impl_->cold_->signalGroup(pgid, signo);
}
Status WarmStartLauncher::signalProcess(pid_t pid, int signo) {
  return impl_->cold_->signalProcess(pid, signo);
}
Status WarmStartLauncher::signalWorker(pid_t pid, bool running, int signo) {
  return impl_->cold_->signalWorker(pid, running, signo);
}
size_t WarmStartLauncher::killAdoptedOrphans(const std::vector<pid_t>& known) {
  return impl_->killAdoptedOrphans(known);
}
char WarmStartLauncher::stateOf(pid_t pid) { return impl_->cold_->stateOf(pid); }
void WarmStartLauncher::adopt(pid_t pgid) { impl_->cold_->adopt(pgid); }
void WarmStartLauncher::prewarm(const std::vector<std::string>& modules) {
  impl_->prewarm(modules);
}
pid_t WarmStartLauncher::warmPid() const { return impl_->warm_.pid; }

bool interpreterWideVariable(const std::string& name) {
  static const std::set<std::string> kNames = {
      "LANG",       "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
      "LD_PRELOAD", "LD_LIBRARY_PATH"};
  return name.rfind("PYTHON", 0) == 0 || name.rfind("LC_", 0) == 0 || kNames.count(name) != 0;
}

std::string warmProcessGrowth(long ready_kib, long now_kib, const WarmStartOptions& options) {
  const long bound =
      static_cast<long>(static_cast<double>(ready_kib) * options.memory_growth_factor) +
      options.memory_slack_kib;
  if (now_kib <= bound) return "";
  return "the warm process grew from " + std::to_string(ready_kib / 1024) + " MiB to " +
         std::to_string(now_kib / 1024) + " MiB since it was ready (bound " +
         std::to_string(bound / 1024) + " MiB)";
}

std::string warmImportsRecord(const std::vector<std::string>& modules) {
  return nlohmann::json(modules).dump();
}

Result<std::vector<std::string>> parseWarmImportsRecord(const std::string& text) {
  if (text.size() > (size_t{4} << 20)) return invalidArgument("the module record is over 4 MiB");
  const auto value = nlohmann::json::parse(text, nullptr, false);
  if (!value.is_array()) return invalidArgument("the module record is not a JSON array");
  if (value.size() > kMaxWarmModules) {
    return invalidArgument("the module record names over " + std::to_string(kMaxWarmModules) +
                           " modules");
  }
  std::vector<std::string> names;
  names.reserve(value.size());
  for (const auto& item : value) {
    if (!item.is_string()) return invalidArgument("the module record holds a non-string");
    const std::string& name = item.get_ref<const std::string&>();
    bool valid = !name.empty() && name.size() <= 200;
    bool start = true;  // of a dotted part
    for (char c : name) {
      const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
      const bool digit = c >= '0' && c <= '9';
      if (c == '.') {
        valid = valid && !start;
        start = true;
      } else {
        // A digit or '-' never starts a part; '-' is in some stdlib names
        // (_sysconfigdata__x86_64-linux-gnu).
        valid = valid && (letter || ((digit || c == '-') && !start));
        start = false;
      }
    }
    if (!valid || start) {
      return invalidArgument("the module record holds '" + name.substr(0, 60) +
                             "', not a Python module name");
    }
    names.push_back(name);
  }
  return names;
}

const std::string& warmProcessModule() {
  static const std::string text = kWarmProcessModule;
  return text;
}

std::string warmIneligibility(const std::vector<std::string>& argv) {
  const bool python_u = argv.size() >= 3 && argv[1] == "-u";
  const bool module = python_u && argv[2] == "-m";
  if (!python_u || (module && argv.size() < 4) || (!module && argv[2].rfind('-', 0) == 0)) {
    return "the workers are not Python programs cpprun starts (`python -u PROGRAM` or "
           "`python -u -m MODULE`)";
  }
  return "";
}

}  // namespace cpprun::agent
