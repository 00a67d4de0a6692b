// The real ProcessLauncher: vfork-class process creation. The agent clones a child that shares
// its memory (clone with CLONE_VM | CLONE_VFORK, as glibc's posix_spawn does) and is suspended
// until that child has exec'd or exited, so starting a worker costs no copy of the agent's page
// tables, whatever the agent's size. posix_spawn alone cannot set the parent-death signal, the
// CPU affinity or the memory policy, hence the small child step here.
//
// The child runs on a stack of its own in the agent's address space, with the agent's memory:
// it allocates nothing, takes no lock and calls no libc function but syscall(2) (no interceptor
// of a sanitizer, no lazily bound symbol with a lock behind it, no errno of its own worth
// keeping). Everything it needs -- argv, envp, the program's path, the CPU and node masks -- is
// prepared by the parent (prepareSpawn, agent/processes/spawn_plan.h); launch() hands it to the
// child. The child writes what failed (the step and errno) into the parent's ChildArgs, which the
// parent reads when it resumes and spawnStepError names with its syscall; no pipe is needed since
// the memory is shared and the parent runs again only after the exec or the exit.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_set>

#include "agent/processes/process_launcher.h"
#include "agent/processes/spawn_plan.h"

extern char** environ;

namespace cpprun::agent {
namespace {

// The child's stack: enough for the child step and the kernel's signal frame, below it one
// PROT_NONE guard page.
constexpr size_t kChildStackBytes = 64 * 1024;

// The kernel's sigset_t: 64 signals.
constexpr size_t kKernelSigsetBytes = 8;

// The kernel's struct sigaction as far as the child uses it: the handler comes first on every
// architecture; the rest is only written by the kernel (old action) or zero (new action).
struct KernelSigaction {
  __sighandler_t handler;
  unsigned long flags;
  void* restorer;
  unsigned long mask[2];
};

// Everything the child reads, prepared by the parent, and what it reports back.
struct ChildArgs {
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  pid_t agent_pid = 0;
  int stdin_fd = -1;  // the spec's, or /dev/null
  int stdout_fd = -1;
  int stderr_fd = -1;
  int controlling_tty_fd = -1;  // -1: a new process group only
  unsigned int fd_limit = 0;    // for closing descriptors without close_range
  const cpu_set_t* cpus = nullptr;
  size_t cpus_bytes = 0;
  const char* cgroup_procs = nullptr;  // the job's cgroup.procs, or none
  int mempolicy_mode = -1;             // -1: inherit
  const unsigned long* nodemask = nullptr;
  unsigned long maxnode = 0;
  // Written by the child before it exits; read by the parent once it runs again.
  SpawnStep failed_step = SpawnStep::kNone;
  int error = 0;
  // Under ThreadSanitizer only (forkChild): where the child reports its failed step and errno.
  int report_fd = -1;
};

#if defined(__clang__) || defined(__GNUC__)
#define CPPRUN_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
#else
#define CPPRUN_NO_SANITIZE
#endif

// Failed: record the step and errno, exit with 127 (what a shell says for "cannot execute").
// exit_group, not exit: a forked child (ThreadSanitizer's) may have a runtime thread of its own.
[[noreturn]] CPPRUN_NO_SANITIZE void childFail(ChildArgs* a, SpawnStep step, int error) {
  a->error = error;
  a->failed_step = step;
  if (a->report_fd >= 0) {
    const int report[2] = {static_cast<int>(step), error};
    ::syscall(SYS_write, a->report_fd, report, sizeof report);
  }
  for (;;) ::syscall(SYS_exit_group, 127);
}

// Makes `from` the child's descriptor `to`, without close-on-exec.
CPPRUN_NO_SANITIZE bool childMoveFd(int from, int to) {
  if (from == to) return ::syscall(SYS_fcntl, to, F_SETFD, 0) == 0;
  return ::syscall(SYS_dup3, from, to, 0) == to;
}

// The child, between clone and exec. Signals are all blocked (by the parent) until the handlers
// are gone: an agent's handler must never run here, on the agent's memory.
CPPRUN_NO_SANITIZE int childMain(void* arg) {
  auto* a = static_cast<ChildArgs*>(arg);
  // Handlers become the default (exec would do that, but only at exec); of the ignored signals
  // SIGPIPE does (the agent ignores it for itself); other ignored signals stay ignored, as the
  // agent's caller (nohup, say) asked.
  for (int sig = 1; sig < _NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    KernelSigaction old{};
    if (::syscall(SYS_rt_sigaction, sig, nullptr, &old, kKernelSigsetBytes) != 0) continue;
    const bool ignored = old.handler == SIG_IGN;
    if (old.handler == SIG_DFL || (ignored && sig != SIGPIPE)) continue;
    KernelSigaction dfl{};
    dfl.handler = SIG_DFL;
    if (::syscall(SYS_rt_sigaction, sig, &dfl, nullptr, kKernelSigsetBytes) != 0) {
      childFail(a, SpawnStep::kSignals, errno);
    }
  }
  if (a->controlling_tty_fd >= 0) {
    // A session of its own (its process group id is its pid, as setpgid would make it), with
    // the terminal as its controlling terminal and its group in the terminal's foreground.
    if (::syscall(SYS_setsid) < 0) childFail(a, SpawnStep::kSession, errno);
    if (::syscall(SYS_ioctl, a->controlling_tty_fd, TIOCSCTTY, 0) != 0) {
      childFail(a, SpawnStep::kControllingTerminal, errno);
    }
  } else if (::syscall(SYS_setpgid, 0, 0) != 0) {
    childFail(a, SpawnStep::kProcessGroup, errno);
  }
  if (a->cgroup_procs != nullptr) {
    const long fd = ::syscall(SYS_openat, AT_FDCWD, a->cgroup_procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0) childFail(a, SpawnStep::kCgroupOpen, errno);
    if (::syscall(SYS_write, fd, "0", 1) != 1) {
      const int error = errno;
      ::syscall(SYS_close, fd);
      childFail(a, SpawnStep::kCgroupWrite, error);
    }
    ::syscall(SYS_close, fd);
  }
  if (::syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
    childFail(a, SpawnStep::kParentDeathSignal, errno);
  }
  // The agent may have died before prctl; then nobody would kill this worker.
  if (::syscall(SYS_getppid) != a->agent_pid) childFail(a, SpawnStep::kAgentGone, ESRCH);
  if (!childMoveFd(a->stdin_fd, STDIN_FILENO)) childFail(a, SpawnStep::kStdin, errno);
  if (a->stdout_fd >= 0 && !childMoveFd(a->stdout_fd, STDOUT_FILENO)) {
    childFail(a, SpawnStep::kStdout, errno);
  }
  if (a->stderr_fd >= 0 && !childMoveFd(a->stderr_fd, STDERR_FILENO)) {
    childFail(a, SpawnStep::kStderr, errno);
  }
  // Nothing of the agent's beyond stdio reaches the worker: not the store's listening socket
  // (a worker outliving its agent would keep the port), not its connections or pipes.
  // (Under ThreadSanitizer the report pipe stays; it is close-on-exec.)
  const unsigned int keep = a->report_fd >= 3 ? static_cast<unsigned int>(a->report_fd) : 0U;
  const bool closed = keep == 0U
                          ? ::syscall(SYS_close_range, 3U, ~0U, 0U) == 0
                          : (keep == 3U || ::syscall(SYS_close_range, 3U, keep - 1U, 0U) == 0) &&
                                ::syscall(SYS_close_range, keep + 1U, ~0U, 0U) == 0;
  if (!closed) {
    for (unsigned int fd = 3; fd < a->fd_limit; ++fd) {
      if (fd != keep) ::syscall(SYS_close, fd);
    }
  }
  if (a->cpus != nullptr && ::syscall(SYS_sched_setaffinity, 0, a->cpus_bytes, a->cpus) != 0) {
    childFail(a, SpawnStep::kCpuAffinity, errno);
  }
  if (a->mempolicy_mode >= 0 &&
      ::syscall(SYS_set_mempolicy, a->mempolicy_mode, a->nodemask, a->maxnode) != 0) {
    childFail(a, SpawnStep::kMemoryPolicy, errno);
  }
  uint64_t empty = 0;
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, nullptr, kKernelSigsetBytes);
  ::syscall(SYS_execve, a->path, a->argv, a->envp);
  childFail(a, SpawnStep::kExec, errno);
}

#if defined(__SANITIZE_THREAD__)
#define CPPRUN_SPAWN_BY_FORK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CPPRUN_SPAWN_BY_FORK 1
#endif
#endif

#ifdef CPPRUN_SPAWN_BY_FORK
// ThreadSanitizer's clone interceptor treats every clone as a fork and runs its child-side fork
// handling in the child, which with CLONE_VM is the parent's own runtime state: the agent then
// believes it forked while multi-threaded and dies at its next thread. Under TSan only, the
// child is forked and reports a failed step through a close-on-exec pipe (EOF: it exec'd).
pid_t forkChild(ChildArgs& child) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return -1;
  child.report_fd = report[1];
  const pid_t pid = ::fork();
  if (pid == 0) {
    childMain(&child);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(report[1]);
  if (pid > 0) {
    int failed[2] = {0, 0};
    ssize_t n;
    while ((n = ::read(report[0], failed, sizeof failed)) < 0 && errno == EINTR) {
    }
    if (n == static_cast<ssize_t>(sizeof failed)) {
      child.failed_step = static_cast<SpawnStep>(failed[0]);
      child.error = failed[1];
    }
  }
  ::close(report[0]);
  errno = fork_errno;
  return pid;
}
#endif

class SystemProcessLauncher : public ProcessLauncher {
 public:
  explicit SystemProcessLauncher(WorkerContainment containment)
      : containment_(std::move(containment)) {}
  ~SystemProcessLauncher() override {
    if (stack_ != nullptr) ::munmap(stack_, stackMappingBytes());
    if (dev_null_ >= 0) ::close(dev_null_);
  }

  Result<pid_t> spawn(const ProcessSpec& spec) override {
    if (spec.argv.empty() || spec.argv[0].empty()) {
      return invalidArgument("no program to run");
    }
    if (Status s = prepareOnce(); !s.isOk()) return s;
    Result<SpawnPlan> plan = prepareSpawn(spec, environ, dev_null_);
    if (!plan.isOk()) return plan.status();
    return launch(plan.value(), spec);
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

  Status signalWorker(pid_t pid, bool running, int signo) override {
    if (pid <= 0) return invalidArgument("bad pid " + std::to_string(pid));
    Status first = Status::ok();
    if (running) {
      // Below it first: once it is dead its children are re-parented and harder to find.
      if (signo == SIGKILL) {
        for (pid_t below : descendantsOf(pid)) ::kill(below, SIGKILL);
      }
      first = signalProcess(pid, signo);
    }
    Status group = signalGroup(pid, signo);
    // Its group is gone now (or going): the sentinel must not kill that number later.
    if (!running && signo == SIGKILL) reportGroup('-', pid);
    return first.isOk() ? group : first;
  }

  void adopt(pid_t pgid) override { reportGroup('+', pgid); }

  size_t killAdoptedOrphans(const std::vector<pid_t>& known) override {
    std::unordered_set<pid_t> keep(known.begin(), known.end());
    size_t killed = 0;
    for (pid_t pid : childrenOf(::getpid())) {
      if (keep.count(pid) != 0) continue;
      if (::kill(pid, SIGKILL) == 0) ++killed;
    }
    return killed;
  }

 private:
  static size_t pageBytes() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }
  static size_t stackMappingBytes() { return kChildStackBytes + pageBytes(); }
  void* stackTop() const { return static_cast<char*>(stack_) + stackMappingBytes(); }

  // The child's stack, /dev/null and the descriptor limit: made at the first spawn, kept.
  Status prepareOnce() {
    if (stack_ != nullptr) return Status::ok();
    dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (dev_null_ < 0) return internalError("cannot open /dev/null: " + errnoText(errno));
    void* stack = ::mmap(nullptr, stackMappingBytes(), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
      return internalError("cannot map a stack for starting workers: " + errnoText(errno));
    }
    ::mprotect(stack, pageBytes(), PROT_NONE);  // the guard page; the stack grows down to it
    stack_ = stack;
    rlimit limit{};
    fd_limit_ = 65536;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      fd_limit_ = static_cast<unsigned int>(std::min<rlim_t>(limit.rlim_cur, 1U << 20));
    }
    return Status::ok();
  }

  // Best effort: a sentinel that stopped reading (SIGSTOP) must not block the agent.
  void reportGroup(char sign, pid_t pgid) {
    if (containment_.group_report_fd < 0) return;
    char line[32];
    const int n = std::snprintf(line, sizeof line, "%c%d\n", sign, static_cast<int>(pgid));
    (void)!::write(containment_.group_report_fd, line, static_cast<size_t>(n));
  }

  // Clones the child that runs `plan` and waits until it has exec'd or failed; a failed
  // child is reaped here, so the agent's reaper never reports a worker that was not started.
  Result<pid_t> launch(const SpawnPlan& plan, const ProcessSpec& spec) {
    ChildArgs child;
    child.path = plan.path.c_str();
    child.argv = plan.argv.data();
    child.envp = plan.envp.data();
    child.agent_pid = ::getpid();
    child.stdin_fd = plan.stdin_fd;
    child.controlling_tty_fd = plan.controlling_tty_fd;
    child.stdout_fd = plan.stdout_fd;
    child.stderr_fd = plan.stderr_fd;
    child.fd_limit = fd_limit_;
    if (!plan.cpu_mask.empty()) {
      child.cpus = reinterpret_cast<const cpu_set_t*>(plan.cpu_mask.data());
      child.cpus_bytes = plan.cpuMaskBytes();
    }
    child.cgroup_procs =
        containment_.cgroup_procs.empty() ? nullptr : containment_.cgroup_procs.c_str();
    child.mempolicy_mode = plan.mempolicy_mode;
    child.nodemask = plan.nodemask.empty() ? nullptr : plan.nodemask.data();
    child.maxnode = plan.maxnode;

    // Every signal blocked from before the clone until the child has reset the handlers (and
    // in this thread until the clone returns, as the child ran on its memory meanwhile).
    sigset_t all;
    sigset_t saved;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &saved);
#ifdef CPPRUN_SPAWN_BY_FORK
    const pid_t pid = forkChild(child);
    const char* const create_call = "fork";
#else
    const pid_t pid = ::clone(childMain, stackTop(), CLONE_VM | CLONE_VFORK | SIGCHLD, &child);
    const char* const create_call = "clone";
#endif
    const int clone_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    if (pid < 0) {
      return internalError("cannot run '" + plan.program + "': " + create_call + ": " +
                           errnoText(clone_errno));
    }
    if (child.failed_step != SpawnStep::kNone) {
      // The child has exited (that is why this thread runs again).
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return spawnStepError(plan, spec, containment_.cgroup_procs, child.failed_step, child.error);
    }
    reportGroup('+', pid);
    return pid;
  }

  const WorkerContainment containment_;
  void* stack_ = nullptr;
  int dev_null_ = -1;
  unsigned int fd_limit_ = 0;
};

// State letter and ppid from /proc/<pid>/stat ("pid (comm) state ppid ...", comm may hold
// spaces and parentheses, so parse after the last ')'); nullopt once the process is gone.
std::optional<std::pair<char, pid_t>> readProcStat(const std::string& pid) {
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return std::nullopt;  // exited meanwhile
  size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  char state = 0;
  long ppid = 0;
  if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) return std::nullopt;
  return std::make_pair(state, static_cast<pid_t>(ppid));
}

// ppid of every process.
std::map<pid_t, pid_t> parentsByPid() {
  std::map<pid_t, pid_t> parents;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return parents;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    if (auto stat = readProcStat(entry->d_name)) parents[static_cast<pid_t>(pid)] = stat->second;
  }
  ::closedir(dir);
  return parents;
}

}  // namespace

std::unique_ptr<ProcessLauncher> makeSystemProcessLauncher(WorkerContainment containment) {
  return std::make_unique<SystemProcessLauncher>(std::move(containment));
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

char ProcessLauncher::stateOf(pid_t pid) { return processState(pid); }

char processState(pid_t pid) {
  auto stat = readProcStat(std::to_string(pid));
  return stat ? stat->first : 0;
}

pid_t parentOf(pid_t pid) {
  auto stat = readProcStat(std::to_string(pid));
  return stat ? stat->second : -1;
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
