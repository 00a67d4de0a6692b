#include "agent/processes/signal_policy.h"

#include <algorithm>

namespace cpprun::agent {

std::vector<int> terminatingSignals() {
  std::vector<int> signals = {SIGHUP,    SIGINT,  SIGQUIT, SIGUSR1,   SIGUSR2, SIGPIPE,
                              SIGALRM,   SIGTERM, SIGXCPU, SIGVTALRM, SIGPROF, SIGIO,
#ifdef SIGSTKFLT
                              SIGSTKFLT,
#endif
#ifdef SIGPWR
                              SIGPWR,
#endif
                              SIGXFSZ};
  for (int signo = SIGRTMIN; signo <= SIGRTMAX; ++signo) signals.push_back(signo);
  std::sort(signals.begin(), signals.end());
  return signals;
}

bool isIgnored(int signo) {
  struct sigaction current {};
  return ::sigaction(signo, nullptr, &current) == 0 && current.sa_handler == SIG_IGN;
}

std::vector<int> signalsToTakeOver() {
  std::vector<int> out;
  for (int signo : terminatingSignals()) {
    if (!isIgnored(signo)) out.push_back(signo);
  }
  return out;
}

sigset_t signalSetOf(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int signo : signals) sigaddset(&set, signo);
  return set;
}

}  // namespace cpprun::agent
