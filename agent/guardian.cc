#include "agent/guardian.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "agent/child_reaper.h"
#include "agent/process_launcher.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace {

// Kills every descendant and reaps until none is left (bounded: a process stuck in
// uninterruptible sleep cannot be waited for forever).
void killRemainingDescendants() {
  timespec deadline{};
  ::clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += 10;
  size_t killed = 0;
  for (;;) {
    for (pid_t pid : descendantsOf(::getpid())) {
      if (::kill(pid, SIGKILL) == 0) ++killed;
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) break;
    if (pid > 0) continue;
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > deadline.tv_sec) {
      CPPRUN_LOG(kError) << "processes left by the agent did not die within 10 s";
      break;
    }
    // Wait for the next SIGCHLD (blocked, so it is pending rather than lost), at most 50 ms.
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    timespec tick{0, 50 * 1000 * 1000};
    ::sigtimedwait(&chld, nullptr, &tick);
  }
  if (killed > 0) {
    CPPRUN_LOG(kWarn) << "the agent ended abnormally; killed " << killed
                      << " process(es) it left behind";
  }
}

}  // namespace

int runUnderGuardian(const std::function<int()>& agent_main,
                     const std::vector<int>& forwarded_signals) {
  becomeChildSubreaper();
  sigset_t waited;
  sigemptyset(&waited);
  sigaddset(&waited, SIGCHLD);
  for (int signo : forwarded_signals) sigaddset(&waited, signo);
  sigset_t previous;
  ::sigprocmask(SIG_BLOCK, &waited, &previous);

  pid_t guardian = ::getpid();
  std::fflush(nullptr);
  pid_t agent = ::fork();
  if (agent < 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    return -1;
  }
  if (agent == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != guardian) std::_Exit(128 + SIGTERM);
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    int code = agent_main();
    std::fflush(nullptr);
    std::_Exit(code);
  }

  int agent_status = -1;
  for (;;) {
    siginfo_t info{};
    int signo = ::sigwaitinfo(&waited, &info);
    if (signo < 0) continue;  // EINTR
    if (signo != SIGCHLD) {
      // From the terminal (SI_KERNEL): the agent is in our process group and got it too.
      if (info.si_code != SI_KERNEL) ::kill(agent, signo);
      continue;
    }
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      if (pid == agent) agent_status = status;
    }
    if (agent_status != -1) break;
  }
  if (WIFSIGNALED(agent_status)) {
    CPPRUN_LOG(kError) << "the agent (pid " << agent << ") was killed by signal "
                       << WTERMSIG(agent_status);
  }
  killRemainingDescendants();
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  return WIFEXITED(agent_status) ? WEXITSTATUS(agent_status) : 128 + WTERMSIG(agent_status);
}

}  // namespace cpprun::agent
