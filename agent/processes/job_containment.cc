#include "agent/processes/job_containment.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "common/logging.h"
#include "common/private_directory.h"

namespace cpprun::agent {

namespace {

using Clock = std::chrono::steady_clock;

bool writeText(const std::string& path, const char* text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t size = std::strlen(text);
  const bool ok = ::write(fd, text, size) == static_cast<ssize_t>(size);
  ::close(fd);
  return ok;
}

std::vector<pid_t> cgroupProcesses(const std::string& dir) {
  std::vector<pid_t> pids;
  std::ifstream in(dir + "/cgroup.procs");
  long pid;
  while (in >> pid) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// "populated 0" in cgroup.events: no process left in it or below it.
bool cgroupEmpty(const std::string& dir) {
  std::ifstream in(dir + "/cgroup.events");
  std::string key;
  int value = 0;
  while (in >> key >> value) {
    if (key == "populated") return value == 0;
  }
  return cgroupProcesses(dir).empty();
}

// The cgroup2 mount point and the root it shows, from /proc/self/mountinfo.
bool cgroup2Mount(std::string* mount_point, std::string* root) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream after(line.substr(dash + 3));
    std::string fstype;
    after >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream before(line.substr(0, dash));
    std::string id, parent, devices;
    before >> id >> parent >> devices >> *root >> *mount_point;
    return true;
  }
  return false;
}

pid_t pidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<pid_t>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// The sentinel: reads "+pgid" / "-pgid" / "done" lines until EOF. "done": exit quietly. EOF
// without it: both cpprun processes are gone; end what is left of the job.
[[noreturn]] void runSentinel(int control_fd, const std::string& cgroup_dir,
                              const std::string& run_dir) {
  std::set<pid_t> groups;
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(control_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      if (line == "done") ::_exit(0);
      if (line.size() < 2) continue;
      const pid_t pgid = static_cast<pid_t>(std::atol(line.c_str() + 1));
      if (pgid <= 1) continue;
      if (line[0] == '+') groups.insert(pgid);
      if (line[0] == '-') groups.erase(pgid);
    }
  }
  size_t ended = 0;
  std::error_code ec;
  if (!cgroup_dir.empty() && std::filesystem::exists(cgroup_dir, ec)) {
    ended += killCgroup(cgroup_dir, 10000);
    ::rmdir(cgroup_dir.c_str());
  }
  for (pid_t pgid : groups) {
    if (::kill(-pgid, SIGKILL) == 0) ++ended;
  }
  if (!run_dir.empty()) (void)removeTree(run_dir);  // follows no link in it
  if (ended > 0) {
    char line[160];
    const int len = std::snprintf(line, sizeof line,
                                  "cpprun: cpprun and its agent were killed; the sentinel ended "
                                  "what was left of the job (%zu)\n",
                                  ended);
    (void)!::write(STDERR_FILENO, line, static_cast<size_t>(len));
  }
  ::_exit(0);
}

}  // namespace

std::string ownCgroupDir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::string path;
  bool found = false;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) {
      path = line.substr(3);
      found = true;
    }
  }
  std::string mount_point, root;
  if (!found || !cgroup2Mount(&mount_point, &root)) return "";
  // The path is relative to the cgroup namespace's root, which the mount shows as `root`.
  if (root != "/" && path.rfind(root, 0) == 0) path = path.substr(root.size());
  if (path == "/") path.clear();
  return mount_point + path;
}

size_t killCgroup(const std::string& dir, int bound_ms) {
  const size_t held = cgroupProcesses(dir).size();
  const auto deadline = Clock::now() + std::chrono::milliseconds(bound_ms);
  const bool has_kill = ::access((dir + "/cgroup.kill").c_str(), W_OK) == 0;
  if (has_kill) writeText(dir + "/cgroup.kill", "1");
  const int events = ::open((dir + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC);
  while (!cgroupEmpty(dir) && Clock::now() < deadline) {
    // Without cgroup.kill (kernels before 5.14): one by one, again for what forked meanwhile.
    if (!has_kill) {
      for (pid_t pid : cgroupProcesses(dir)) ::kill(pid, SIGKILL);
    }
    // cgroup.events signals every change of "populated" (POLLPRI); 20 ms at most per round.
    pollfd p{events, POLLPRI, 0};
    ::poll(&p, events >= 0 ? 1 : 0, 20);
  }
  if (events >= 0) ::close(events);
  return held;
}

std::unique_ptr<JobContainment> JobContainment::start(const std::string& temporary_run_dir) {
  std::unique_ptr<JobContainment> c(new JobContainment());
  // The job's cgroup, below our own.
  const char* wanted = std::getenv("CPPRUN_JOB_CGROUP");
  const std::string own =
      wanted != nullptr && std::string(wanted) == "off" ? std::string() : ownCgroupDir();
  if (!own.empty()) {
    const std::string dir = own + "/cpprun-" + std::to_string(::getpid());
    if (::mkdir(dir.c_str(), 0755) == 0) {
      c->cgroup_dir_ = dir;
    } else {
      CPPRUN_LOG(kDebug) << "no cgroup for the job (mkdir " << dir << ": " << std::strerror(errno)
                         << "); the sentinel falls back to process groups";
    }
  }

  int control[2];
  int info[2];
  if (::pipe2(control, O_CLOEXEC) != 0) return c;
  if (::pipe2(info, O_CLOEXEC) != 0) {
    ::close(control[0]);
    ::close(control[1]);
    return c;
  }
  const std::string cgroup_dir = c->cgroup_dir_;
  const pid_t middle = ::fork();
  if (middle == 0) {
    // The middle process: forks the sentinel (which so belongs to nobody in cpprun's tree), then
    // checks the cgroup takes a process by moving itself in, reports both, and exits.
    ::close(control[1]);
    ::close(info[0]);
    const pid_t sentinel = ::fork();
    if (sentinel == 0) {
      ::close(info[1]);
      ::setsid();
      ::prctl(PR_SET_NAME, "cpprun-sentinel");
      const int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0) {
        ::dup2(null_fd, STDIN_FILENO);
        ::dup2(null_fd, STDOUT_FILENO);
      }
      // Nothing of cpprun's but the pipe and stderr: no listening socket, no run-dir file.
      if (control[0] != 3) {
        ::dup2(control[0], 3);
      }
      ::syscall(SYS_close_range, 4U, ~0U, 0U);
      ::fcntl(3, F_SETFD, 0);
      // Signals stay blocked as the guardian has them: only SIGKILL ends the sentinel.
      runSentinel(3, cgroup_dir, temporary_run_dir);
    }
    int reply[2] = {static_cast<int>(sentinel), 0};
    if (!cgroup_dir.empty() && writeText(cgroup_dir + "/cgroup.procs", "0")) reply[1] = 1;
    (void)!::write(info[1], reply, sizeof reply);
    ::_exit(0);
  }
  ::close(control[0]);
  ::close(info[1]);
  int reply[2] = {-1, 0};
  if (middle > 0) {
    ssize_t n;
    while ((n = ::read(info[0], reply, sizeof reply)) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(sizeof reply)) reply[0] = -1;
    while (::waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  ::close(info[0]);
  if (reply[0] <= 0) {
    ::close(control[1]);
    if (!c->cgroup_dir_.empty()) ::rmdir(c->cgroup_dir_.c_str());
    c->cgroup_dir_.clear();
    CPPRUN_LOG(kDebug) << "cannot start the job's sentinel";
    return c;
  }
  if (reply[1] == 0 && !c->cgroup_dir_.empty()) {
    CPPRUN_LOG(kDebug) << "the job's cgroup " << c->cgroup_dir_
                       << " does not take processes; the sentinel falls back to process groups";
    ::rmdir(c->cgroup_dir_.c_str());
    c->cgroup_dir_.clear();
  }
  c->sentinel_pid_ = reply[0];
  c->sentinel_pidfd_ = pidfdOpen(c->sentinel_pid_);
  c->control_fd_ = control[1];
  ::fcntl(c->control_fd_, F_SETFL, O_NONBLOCK);
  return c;
}

JobContainment::~JobContainment() {
  finish();
  if (sentinel_pidfd_ >= 0) ::close(sentinel_pidfd_);
}

WorkerContainment JobContainment::forWorkers() const {
  WorkerContainment w;
  if (!cgroup_dir_.empty()) w.cgroup_procs = cgroup_dir_ + "/cgroup.procs";
  w.group_report_fd = control_fd_;
  return w;
}

size_t JobContainment::finish(int bound_ms) {
  if (finished_) return 0;
  finished_ = true;
  size_t left = 0;
  if (!cgroup_dir_.empty()) {
    left = killCgroup(cgroup_dir_, bound_ms);
    if (::rmdir(cgroup_dir_.c_str()) != 0 && errno != ENOENT) {
      CPPRUN_LOG(kWarn) << "cannot remove the job's cgroup " << cgroup_dir_ << ": "
                        << std::strerror(errno);
    }
  }
  if (control_fd_ >= 0) {
    (void)!::write(control_fd_, "done\n", 5);
    ::close(control_fd_);
    control_fd_ = -1;
    // The sentinel exits on "done": wait for it, so nothing of cpprun's outlives cpprun.
    if (sentinel_pidfd_ >= 0) {
      pollfd p{sentinel_pidfd_, POLLIN, 0};
      ::poll(&p, 1, 2000);
    }
  }
  return left;
}

}  // namespace cpprun::agent
