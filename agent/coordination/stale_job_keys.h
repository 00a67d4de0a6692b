// StaleJobKeys: which of the job's keys (job_keys.h) no agent reads any more, so that the
// decider deletes them and the store stays the same size over thousands of restarts (before,
// every attempt left its ~10 keys behind: a 2-node job's store host grew by ~3.5 kB a restart).
//
// When attempt n has started (its decider is about to say "go"), every member of attempt n is
// done with attempt n-1: static, each wrote attempt/<n>/ready after tearing n-1 down, which
// follows its read of n-1's decision; elastic, each joined the round of n after reading n-1's
// decision. Attempt n-2 and those before it then have no reader, and their keys go
// ("attempt/<k>/", and on etcd node 0's liveness snapshot "alive.snapshot/<k>/"). Attempt n-1
// stays for one more attempt, for a late reader of its decision that is not in attempt n (a
// spare, a member lost, excluded or leaving in n-1). Rounds likewise: when the attempt of round
// r starts, rounds up to r-2 are closed and read by nobody (a spare waits in round r+1; an agent
// that was no member of r-1 has moved on), so "rdzv/round/<q>/" goes for q <= r-2.
//
// What stays: the exclusion history ("exclusion/failures", which must outlive attempts; the
// decider keeps only the window's records, node_exclusion.h), one heartbeat key per agent, the
// static join's keys, the round counter, and the last two attempts' keys (the final attempt's
// are read by every agent and spare that ends with the job).
//
// Each prefix is returned once per StaleJobKeys, looking back at most kStaleLookBack attempts
// (rounds): a decider that takes over (etcd: the lowest live member, or a new round's node 0)
// finds what the deciders before it started already forgotten, and need not reach back to 0.
//
// The prefixes are job_keys.h's: stale_job_keys_test pins every builder's keys under them.
//
// Thread safety: StaleJobKeys is one thread's (the coordinator's control thread); the free
// functions are safe from any thread.
#pragma once

#include <string>
#include <vector>

namespace cpprun::agent {

inline constexpr int kStaleLookBack = 16;

// "attempt/<n>/": every key of attempt n.
std::string attemptKeysPrefix(int attempt);
// "rdzv/round/<r>/": every key of elastic round r.
std::string roundKeysPrefix(int round);
// "alive.snapshot/<n>/": etcd node 0's liveness snapshot of attempt n (aliveSnapshotKey).
std::string aliveSnapshotPrefix(int attempt);

class StaleJobKeys {
 public:
  // The prefixes (relative to the job's namespace, job_keys.h) that no agent reads once attempt
  // `attempt` of elastic round `round` (-1: static) has started, those not returned before.
  std::vector<std::string> started(int attempt, int round);

 private:
  int attempts_forgotten_ = 0;  // attempts [0, this) are forgotten (or before the look-back)
  int rounds_forgotten_ = 0;
};

}  // namespace cpprun::agent
