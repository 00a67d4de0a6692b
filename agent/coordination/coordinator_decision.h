// DecisionExchange: the end of an attempt, on the store coordinator's control thread
// (coordinator_shared.h): every agent reports how its workers ended; the decider (the store
// host, or the round's node 0, or the member standing in for a lost node 0) waits for every
// report or a lost member's stand-in, gives up members that do not acknowledge the stop, decides
// for the whole job (decideJob), excludes a node that keeps failing, and publishes the decision;
// the others read it. After the final decision: the end of the job (finishJob).
//
// Thread safety: the control thread only.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "agent/coordination/coordinator_shared.h"
#include "agent/coordination/job_decision.h"

namespace cpprun::agent {

class DecisionExchange {
 public:
  explicit DecisionExchange(CoordinatorShared& shared) : s_(shared) {}

  // This agent's report of attempt n, then the job's decision (this agent's own, when it
  // decides). Store trouble is thrown (the caller's guarded()).
  Result<JobDecision> end(int n, const AttemptReport& report);

 private:
  using SystemClock = std::chrono::system_clock;

  // Host: every node's report (or a lost node's stand-in), then one decision for the job
  // (decideJob).
  Result<JobDecision> decide(int n);

  // Decider: when the attempt's root cause was one node's own workers, records it in the job's
  // failure history (in the store, so a later decider reads it too) and excludes the node once
  // it has caused exclude_after failures within exclude_window (node_exclusion.h).
  // `charged`: the node whose workers caused the failure (the stop's owner, or a hang's culprit
  // node when `by_verdict`; -1: nobody).
  void considerExclusion(const Membership& membership, const std::map<int, NodeOutcome>& outcomes,
                         const StopClaim& stop, int charged, bool by_verdict, int waiting_nodes,
                         SystemClock::time_point now, JobDecision& d);

  // After the final decision: wake every watcher (the stop key), tell agents still waiting to
  // join that the job is over, count this agent out and, on the host, keep serving until
  // everyone has read the decision (bounded).
  void finishJob(int n, const JobDecision& decision);

  // Publishes the decision; host_per_round: the first decision written wins (a node 0 that
  // was only slow and the member standing in for it may both decide). Returns the one stored.
  Result<JobDecision> publishDecision(int n, const JobDecision& decision, int readers);

  Result<JobDecision> readDecision(int n);
  // A node's report from the bytes of `key`; one that cannot be decoded reads as failed, saying
  // why (the job's outcome never rests on what a stranger wrote).
  static AttemptReport readReport(const std::string& key, const std::vector<uint8_t>& bytes);

  // Decider, kStopAckBound after it saw attempt n's stop: gives up the members in `missing`
  // (no report yet) that have not acknowledged the stop and whose heartbeat has not moved since,
  // as lost by heartbeat (memberLost). Returns true when it gave up any. Control thread.
  bool giveUpUnacknowledged(int n, const Membership& m, const std::vector<int>& missing,
                            const StopSeen& seen);

  CoordinatorShared& s_;
};

}  // namespace cpprun::agent
