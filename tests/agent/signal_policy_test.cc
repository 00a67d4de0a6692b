// The signals cpprun takes over so none can end it by default.
#include "agent/processes/signal_policy.h"

#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>

namespace {

using namespace cpprun::agent;

bool has(const std::vector<int>& v, int signo) {
  return std::find(v.begin(), v.end(), signo) != v.end();
}

}  // namespace

TEST_CASE("every catchable signal that terminates by default is taken over, no fault is",
          "[unit]") {
  const std::vector<int> signals = terminatingSignals();
  for (int signo : {SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGXCPU,
                    SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT}) {
    CHECK(has(signals, signo));
  }
  for (int signo = SIGRTMIN; signo <= SIGRTMAX; ++signo) CHECK(has(signals, signo));
  for (int signo : {SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS,
                    SIGCHLD, SIGCONT, SIGTSTP, SIGTTIN, SIGTTOU, SIGWINCH, SIGURG}) {
    CHECK_FALSE(has(signals, signo));
  }
  CHECK(std::is_sorted(signals.begin(), signals.end()));
}

TEST_CASE("a signal the caller ignored stays ignored", "[unit]") {
  struct sigaction old {};
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGUSR2, &ignore, &old) == 0);
  CHECK(isIgnored(SIGUSR2));
  CHECK_FALSE(has(signalsToTakeOver(), SIGUSR2));
  REQUIRE(::sigaction(SIGUSR2, &old, nullptr) == 0);
  CHECK(has(signalsToTakeOver(), SIGUSR2));
}
