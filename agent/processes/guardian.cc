#include "agent/processes/guardian.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>

#include "agent/console/worker_terminal.h"
#include "agent/processes/child_reaper.h"
#include "agent/processes/job_containment.h"
#include "agent/processes/process_launcher.h"
#include "agent/processes/signal_policy.h"
#include "agent/supervision/stuck_process.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace {

// Kills every descendant and reaps until none is left, at most `bound` (a process stuck in
// uninterruptible sleep cannot be waited for forever). Returns how many distinct live processes
// it found (zombies already dead are not counted; each process is counted once however often it
// is signalled) and, in `unreaped`, those still alive at the end. `agent_gave_up`: the agent
// already waited the reap bound for its stuck workers (it exited kExitUnreaped), so when every
// process left is in uninterruptible sleep there is nothing more to wait for.
size_t killRemainingDescendants(std::chrono::milliseconds bound, bool agent_gave_up,
                                std::vector<StuckProcess>& unreaped) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::set<pid_t> killed;
  for (;;) {
    bool only_uninterruptible = true;
    std::vector<pid_t> live;
    for (pid_t pid : descendantsOf(::getpid())) {
      const char state = processState(pid);
      if (state == 0 || state == 'Z') continue;
      live.push_back(pid);
      if (state != 'D') only_uninterruptible = false;
      if (::kill(pid, SIGKILL) == 0) killed.insert(pid);
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) break;
    if (pid > 0) continue;
    const bool give_up = !live.empty() && only_uninterruptible && agent_gave_up;
    if (give_up || std::chrono::steady_clock::now() >= deadline) {
      for (pid_t left : live) {
        unreaped.push_back(inspectProcess(left));
        killed.erase(left);  // signalled, not killed: counted as left, not as killed
      }
      break;
    }
    // Wait for the next SIGCHLD (blocked, so it is pending rather than lost), at most 50 ms.
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    timespec tick{0, 50 * 1000 * 1000};
    ::sigtimedwait(&chld, nullptr, &tick);
  }
  return killed.size();
}

}  // namespace

int runUnderGuardian(const std::function<int(const WorkerContainment&)>& agent_main,
                     const GuardianOptions& options) {
  // Every signal that could end the guardian is taken over (signal_policy.h): waited for here,
  // never delivered. The agent starts with them blocked too and unblocks them once its loop
  // catches them, so no signal sent in between ends it either.
  std::vector<int> taken_over = signalsToTakeOver();
  for (int signo : options.forwarded_signals) {
    if (std::find(taken_over.begin(), taken_over.end(), signo) == taken_over.end()) {
      taken_over.push_back(signo);
    }
  }
  taken_over.push_back(SIGCHLD);
  const sigset_t waited = signalSetOf(taken_over);
  sigset_t previous;
  ::sigprocmask(SIG_BLOCK, &waited, &previous);
  // Before becoming a subreaper: the sentinel must not be re-parented to the guardian.
  std::unique_ptr<JobContainment> containment = JobContainment::start(options.temporary_run_dir);
  const WorkerContainment for_workers = containment->forWorkers();
  becomeChildSubreaper();

  // The terminal's modes as the user left them: the agent switches them while it forwards
  // keystrokes (stdin_forwarder.h) and restores them, and if it cannot (killed), this does.
  const std::optional<termios> terminal_modes = terminalModesOf(STDIN_FILENO);

  pid_t guardian = ::getpid();
  std::fflush(nullptr);
  pid_t agent = ::fork();
  if (agent < 0) {
    containment->finish();
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    return -1;
  }
  if (agent == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != guardian) std::_Exit(128 + SIGTERM);
    int code = agent_main(for_workers);
    std::fflush(nullptr);
    std::_Exit(code);
  }

  int agent_status = -1;
  for (;;) {
    siginfo_t info{};
    int signo = ::sigwaitinfo(&waited, &info);
    if (signo < 0) continue;  // EINTR
    if (signo != SIGCHLD) {
      // From the terminal (SI_KERNEL): the agent is in our process group and got it too. From
      // ourselves (SIGPIPE of a write to a closed console): nothing to pass on. Anything else
      // goes to the agent, which acts on the handled ones and logs and ignores the rest.
      if (info.si_code != SI_KERNEL && info.si_pid != guardian) ::kill(agent, signo);
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
  // First the job's processes, then the words: a console that stalls the log line must not
  // keep them alive.
  std::vector<StuckProcess> unreaped;
  const bool agent_gave_up = WIFEXITED(agent_status) && WEXITSTATUS(agent_status) == kExitUnreaped;
  size_t killed = killRemainingDescendants(options.reap_timeout, agent_gave_up, unreaped);
  // Processes already given up on are not waited for again in the cgroup.
  killed +=
      containment->finish(unreaped.empty() ? static_cast<int>(options.reap_timeout.count()) : 0);
  if (terminal_modes) restoreTerminalModes(STDIN_FILENO, *terminal_modes);
  const bool abnormal = WIFSIGNALED(agent_status);
  if (abnormal) {
    CPPRUN_LOG(kError) << "the agent (pid " << agent << ") was killed by signal "
                       << WTERMSIG(agent_status);
  }
  if (killed > 0) {
    CPPRUN_LOG(kWarn) << (abnormal ? "the agent ended abnormally; " : "") << "killed " << killed
                      << " process(es) it left behind";
  }
  for (const StuckProcess& p : unreaped) {
    CPPRUN_LOG(kError) << describeStuck(p) << ": still alive after SIGKILL; cpprun cannot end it "
                       << "(exit 7: see docs/troubleshooting.md)";
  }
  // The mask stays as it is: a signal arriving from here on must not end the guardian by its
  // default action before it has returned the agent's result (the caller exits with it).
  if (!unreaped.empty()) return kExitUnreaped;
  return WIFEXITED(agent_status) ? WEXITSTATUS(agent_status) : 128 + WTERMSIG(agent_status);
}

}  // namespace cpprun::agent
