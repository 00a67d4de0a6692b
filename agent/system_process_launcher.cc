// The real ProcessLauncher: Boost.Process v1 for fork/exec, environment and exec-error
// reporting; a custom exec-setup step for what Boost.Process does not do (a process group of
// its own, the parent-death signal, default signal state, the given stdout/stderr).
// This is the only translation unit that includes Boost.Process.
#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_set>

#include "agent/process_launcher.h"

extern char** environ;

namespace bp = boost::process;

namespace cpprun::agent {
namespace {

// The agent's environment with `overrides` applied, as "NAME=value" strings.
std::vector<std::string> mergedEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    if (overrides.count(std::string(*e, static_cast<size_t>(eq - *e))) != 0) continue;
    merged.emplace_back(*e);
  }
  for (const auto& [name, value] : overrides) merged.push_back(name + "=" + value);
  return merged;
}

struct WorkerExecSetup : bp::extend::handler {
  pid_t agent_pid = 0;
  int stdout_fd = -1;
  int stderr_fd = -1;
  char** envp = nullptr;
  char** argv = nullptr;

  // In the agent, before fork, after bp::exe's own set-up (it comes first in the sequence):
  // execve gets argv and the environment exactly as spawn() built them. Not bp::environment:
  // in Boost 1.74 its find() reads past the end of shorter entries (found by ASan).
  template <typename Executor>
  void on_setup(Executor& exec) const {
    exec.env = envp;
    exec.cmd_line = argv;
  }

  // In the child between fork and exec: only async-signal-safe calls.
  template <typename Executor>
  void on_exec_setup(Executor& /*exec*/) const {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The agent may have died between fork and prctl; then nobody would kill us.
    if (::getppid() != agent_pid) ::_exit(127);
    sigset_t all;
    sigemptyset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    // Handlers are reset by exec; ignored signals are not, and the agent ignores SIGPIPE.
    ::signal(SIGPIPE, SIG_DFL);
    if (stdout_fd >= 0) ::dup2(stdout_fd, STDOUT_FILENO);
    if (stderr_fd >= 0) ::dup2(stderr_fd, STDERR_FILENO);
    // Nothing of the agent's beyond stdio reaches the worker: not the store's listening socket
    // (a worker outliving its agent would keep the port), not its connections. Marked
    // close-on-exec rather than closed, so Boost.Process's exec-error pipe still works.
    if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 65536; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
};

class SystemProcessLauncher : public ProcessLauncher {
 public:
  Result<pid_t> spawn(const ProcessSpec& spec) override {
    if (spec.argv.empty() || spec.argv[0].empty()) {
      return invalidArgument("no program to run");
    }
    boost::filesystem::path program = spec.argv[0];
    if (spec.argv[0].find('/') == std::string::npos) {
      program = bp::search_path(spec.argv[0]);
      if (program.empty()) {
        return invalidArgument("cannot run '" + spec.argv[0] + "': not found in PATH");
      }
    }
    std::vector<std::string> env = mergedEnvironment(spec.env);
    std::vector<char*> envp;
    envp.reserve(env.size() + 1);
    for (auto& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = spec.argv;
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    WorkerExecSetup setup;
    setup.agent_pid = ::getpid();
    setup.stdout_fd = spec.stdout_fd;
    setup.stderr_fd = spec.stderr_fd;
    std::error_code ec;
    setup.envp = envp.data();
    setup.argv = argv.data();
    // `setup` after bp::exe: its on_setup replaces the command line bp::exe built.
    bp::child child(bp::exe = program, setup, bp::std_in < bp::null, ec);
    if (ec) {
      return invalidArgument("cannot run '" + spec.argv[0] + "': " + ec.message());
    }
    pid_t pid = child.id();
    // The agent reaps its children itself (ChildReaper); the handle must not.
    child.detach();
    return pid;
  }

  Status signalGroup(pid_t pgid, int signo) override {
    if (pgid <= 0) return invalidArgument("bad process group " + std::to_string(pgid));
    if (::killpg(pgid, signo) != 0 && errno != ESRCH) {
      return internalError("killpg(" + std::to_string(pgid) + ", " + std::to_string(signo) +
                           "): " + std::strerror(errno));
    }
    return Status::ok();
  }

  Status signalProcess(pid_t pid, int signo) override {
    if (pid <= 0) return invalidArgument("bad pid " + std::to_string(pid));
    if (::kill(pid, signo) != 0 && errno != ESRCH) {
      return internalError("kill(" + std::to_string(pid) + ", " + std::to_string(signo) +
                           "): " + std::strerror(errno));
    }
    return Status::ok();
  }

  size_t killAdoptedOrphans(const std::vector<pid_t>& known) override {
    std::unordered_set<pid_t> keep(known.begin(), known.end());
    size_t killed = 0;
    for (pid_t pid : childrenOf(::getpid())) {
      if (keep.count(pid) != 0) continue;
      if (::kill(pid, SIGKILL) == 0) ++killed;
    }
    return killed;
  }
};

// ppid of every process from /proc/<pid>/stat ("pid (comm) state ppid ...", comm may hold
// spaces and parentheses, so parse after the last ')').
std::map<pid_t, pid_t> parentsByPid() {
  std::map<pid_t, pid_t> parents;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return parents;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    std::ifstream stat("/proc/" + std::string(entry->d_name) + "/stat");
    std::string text;
    if (!std::getline(stat, text)) continue;  // exited meanwhile
    size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) continue;
    parents[static_cast<pid_t>(pid)] = static_cast<pid_t>(ppid);
  }
  ::closedir(dir);
  return parents;
}

}  // namespace

std::unique_ptr<ProcessLauncher> makeSystemProcessLauncher() {
  return std::make_unique<SystemProcessLauncher>();
}

// The kernel's own list of a process's children: /proc/<pid>/task/<tid>/children for each of
// its threads (an orphan is re-parented to one thread of its subreaper). A few small reads,
// where scanning /proc costs one open per process on the machine — which adds up when hundreds
// of agents share a host. nullopt when the kernel lacks the file (CONFIG_PROC_CHILDREN).
std::optional<std::vector<pid_t>> childrenFromTaskFiles(pid_t parent) {
  const std::string task_dir = "/proc/" + std::to_string(parent) + "/task";
  DIR* dir = ::opendir(task_dir.c_str());
  if (dir == nullptr) return std::nullopt;
  std::vector<pid_t> children;
  bool any_file = false;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream in(task_dir + "/" + entry->d_name + "/children");
    if (!in) continue;
    any_file = true;
    long pid;
    while (in >> pid) children.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  if (!any_file) return std::nullopt;
  return children;
}

std::vector<pid_t> childrenOf(pid_t parent) {
  if (auto fast = childrenFromTaskFiles(parent)) return *fast;
  std::vector<pid_t> children;
  for (const auto& [pid, ppid] : parentsByPid()) {
    if (ppid == parent) children.push_back(pid);
  }
  return children;
}

std::vector<pid_t> descendantsOf(pid_t ancestor) {
  std::vector<pid_t> out;
  std::vector<pid_t> frontier{ancestor};
  if (childrenFromTaskFiles(ancestor)) {
    while (!frontier.empty()) {
      const pid_t p = frontier.back();
      frontier.pop_back();
      for (pid_t child : childrenFromTaskFiles(p).value_or(std::vector<pid_t>{})) {
        out.push_back(child);
        frontier.push_back(child);
      }
    }
    return out;
  }
  std::multimap<pid_t, pid_t> children;
  for (const auto& [pid, ppid] : parentsByPid()) children.emplace(ppid, pid);
  while (!frontier.empty()) {
    pid_t p = frontier.back();
    frontier.pop_back();
    auto range = children.equal_range(p);
    for (auto it = range.first; it != range.second; ++it) {
      out.push_back(it->second);
      frontier.push_back(it->second);
    }
  }
  return out;
}

}  // namespace cpprun::agent
