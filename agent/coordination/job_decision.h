// Job decision: the host's one decision for the whole job after an attempt, from what every
// node reported, who claimed the attempt's stop and the restart budget. Pure: no store, no
// clock (the caller passes the time), no logging; the coordinator collects the reports
// (store_job_coordinator.cc) and publishes the result.
//
// Precedence: the restart policy's (restart_policy.h, decideAttempt) over every node's report —
// a node that could not start its workers fails the job; else a forwarded signal stops it; else
// lost nodes (static: the job fails; elastic: the others re-form while at least min_nodes are
// left, without using the budget); else agents waiting to join re-form the group (no budget);
// else a node that asked to leave (StopCause::kLeave) re-forms the group without it (no
// budget); else a failure or a stop claim restarts while the budget lasts, then fails; else the
// job succeeded. Failures come root cause first: lost nodes' stand-ins, then the stop
// claimant's own failures, then every other node's, marked collateral unless they are teardown.
//
// Thread safety: free functions on values; safe from any thread.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "agent/coordination/job_coordinator.h"
#include "agent/coordination/job_keys.h"

namespace cpprun::agent {

// One node's part of an attempt, as the host collected it.
struct NodeOutcome {
  bool lost = false;       // the host declared the node lost; it will not report
  std::string lost_error;  // lost: why (names the node)
  AttemptReport report;    // !lost: what the node reported (its failures carry their host)
};

struct DecisionPolicy {
  int max_restarts = 0;  // the job's restart budget
  bool elastic = false;
  int min_nodes = 1;  // elastic: fewer live nodes than this cannot go on
  // Elastic: agents waiting in the next round (hot spares). They count towards min_nodes when
  // nodes are lost or leave: the group re-forms with them.
  int waiting_nodes = 0;
};

// REQUIRES: `outcomes` has an entry for every rank 0..membership.group_world_size-1.
// `stop`: the attempt's stop claim (a default StopClaim when nobody claimed it).
// `restarts_used`: of the budget before this decision; the result's restarts_used is the
// count after it. `now`: the time stamped on lost nodes' stand-in failures.
JobDecision decideJob(const Membership& membership, const std::map<int, NodeOutcome>& outcomes,
                      const StopClaim& stop, const DecisionPolicy& policy, int restarts_used,
                      std::chrono::system_clock::time_point now);

// Every agent reads the decision: at 1,024 nodes x 8 ranks the failures of every node's
// torn-down or waiting ranks would make it megabytes, read 1,024 times. The decision keeps the
// first kMaxDecisionFailures (root causes and failures of their own first, in order) and says in
// its summary how many it lists; every node's own report lists its own ranks (the supervisor
// adds them). Unchanged when it has no more.
inline constexpr size_t kMaxDecisionFailures = 64;
void compactDecision(JobDecision& decision);

// A hang's verdict over the whole job (stall_verdict.h): every node's rank states, each with
// its node's group rank and host.
struct JobStallVerdict {
  StallVerdict verdict;
  std::vector<RankState> states;
  int culprit_node = -1;  // group rank of the first culprit's node; -1: no culprit
};
// When nodes reported rank states (a stall stopped the attempt) and a rank was in a collective:
// decides the verdict and applies it to `decision` — culprits first as the root cause, waiting
// ranks listed as waiting, the summary the verdict's line. nullopt (decision unchanged)
// otherwise. REQUIRES: membership.agents covers every rank in `outcomes`.
std::optional<JobStallVerdict> applyJobStallVerdict(const Membership& membership,
                                                    const std::map<int, NodeOutcome>& outcomes,
                                                    JobDecision& decision);

}  // namespace cpprun::agent
