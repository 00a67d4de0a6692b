// The restart policy (restart_policy.h) as one table: every combination of what an attempt can
// have seen (lost store, start failure, signal, workers failed, stopped by a peer; none of them:
// succeeded) with the restart budget left or spent. Pure: no supervisor, no store.
#include "agent/supervision/restart_policy.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <string>

namespace {

using namespace cpprun::agent;

// One row per fact, highest precedence first: the first row whose fact holds names the attempt,
// and its last column says whether it restarts when the budget is left.
struct Row {
  bool (*holds)(const AttemptFacts&);
  AttemptEnd end;
  bool restarts_with_budget;
};
const Row kTable[] = {
    {[](const AttemptFacts& f) { return f.lost_peers; }, AttemptEnd::kLostPeers, false},
    {[](const AttemptFacts& f) { return f.start_failed; }, AttemptEnd::kStartFailed, false},
    {[](const AttemptFacts& f) { return f.signal != 0; }, AttemptEnd::kSignalled, false},
    {[](const AttemptFacts& f) { return f.workers_failed; }, AttemptEnd::kWorkersFailed, true},
    {[](const AttemptFacts& f) { return f.peer_stopped; }, AttemptEnd::kStoppedByPeer, true},
    {[](const AttemptFacts&) { return true; }, AttemptEnd::kSucceeded, false},
};

AttemptFacts factsOf(int bits) {
  AttemptFacts f;
  f.lost_peers = (bits & 1) != 0;
  f.start_failed = (bits & 2) != 0;
  f.signal = (bits & 4) != 0 ? SIGTERM : 0;
  f.workers_failed = (bits & 8) != 0;
  f.peer_stopped = (bits & 16) != 0;
  return f;
}

}  // namespace

TEST_CASE("restart policy: every combination of facts and budget follows the one table", "[unit]") {
  int restarts = 0;
  for (int bits = 0; bits < 64; ++bits) {
    const AttemptFacts f = factsOf(bits);
    const bool budget_left = (bits & 32) != 0;
    const Row* row = nullptr;
    for (const Row& r : kTable) {
      if (r.holds(f)) {
        row = &r;
        break;
      }
    }
    REQUIRE(row != nullptr);
    const AttemptVerdict v = decideAttempt(f, budget_left);
    INFO("facts " << (bits & 31) << (budget_left ? ", budget left" : ", budget spent"));
    CHECK(std::string(attemptEndName(v.end)) == attemptEndName(row->end));
    CHECK(v.restart == (budget_left && row->restarts_with_budget));
    restarts += v.restart ? 1 : 0;
  }
  // Only failed workers or a peer's stop with nothing above them, and the budget left: 3 of 64.
  CHECK(restarts == 3);
}

TEST_CASE("restart policy: the cases the supervisor and the job's decision rely on", "[unit]") {
  AttemptFacts signalled_while_failing;
  signalled_while_failing.signal = SIGINT;
  signalled_while_failing.workers_failed = true;  // no restart after a handled signal
  CHECK(decideAttempt(signalled_while_failing, true).end == AttemptEnd::kSignalled);
  CHECK_FALSE(decideAttempt(signalled_while_failing, true).restart);

  AttemptFacts failed_and_stopped;
  failed_and_stopped.workers_failed = true;
  failed_and_stopped.peer_stopped = true;  // a local failure is reported, not the peer's stop
  CHECK(decideAttempt(failed_and_stopped, true).end == AttemptEnd::kWorkersFailed);

  AttemptFacts start_failed;
  start_failed.start_failed = true;
  start_failed.workers_failed = true;  // the started workers were killed: exit 3, not 1
  CHECK(decideAttempt(start_failed, true).end == AttemptEnd::kStartFailed);

  // A signal during the teardown of a start failure does not hide the start failure (one node:
  // exit 3; the job: the node that could not start is named).
  AttemptFacts start_failed_then_signalled;
  start_failed_then_signalled.start_failed = true;
  start_failed_then_signalled.signal = SIGTERM;
  CHECK(decideAttempt(start_failed_then_signalled, true).end == AttemptEnd::kStartFailed);

  AttemptFacts spent;
  spent.workers_failed = true;
  CHECK(decideAttempt(spent, true).restart);
  CHECK_FALSE(decideAttempt(spent, false).restart);  // the budget is spent: the job fails
  CHECK(decideAttempt(spent, false).end == AttemptEnd::kWorkersFailed);

  CHECK(decideAttempt(AttemptFacts{}, true).end == AttemptEnd::kSucceeded);
  CHECK_FALSE(decideAttempt(AttemptFacts{}, true).restart);
}
