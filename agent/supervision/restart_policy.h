// Restart policy: how an attempt ended and whether another one follows, from what was seen
// during it and whether the restart budget allows one more. The one place this precedence is
// written: the single-node supervisor (supervisor.cc) decides its restarts, its multi-node
// report and its job's outcome with it, and the store host's decision for a whole multi-node job
// (job_decision.cc) applies it to what every node reported.
//
// Precedence, highest first (the first fact that holds names the attempt):
//   lost store > start failure > signal > workers failed > stopped by a peer > succeeded.
// Only an attempt whose workers failed, or that a peer stopped, restarts, and only while the
// budget lasts: a lost store, a start failure (a missing program does not appear by restarting)
// and a handled signal end the job.
//
// Thread safety: free functions on values; safe from any thread.
#pragma once

namespace cpprun::agent {

// How an attempt ended. When several things happened in one attempt (a handled signal arrived
// while a worker was failing, a peer's stop raced a local failure), the earliest in this list
// names it.
enum class AttemptEnd {
  kLostPeers,      // the job's store could not be reached: the job ends (exit 4)
  kStartFailed,    // the attempt could not start its workers (exit 3)
  kSignalled,      // a handled signal reached this agent: no restart follows
  kWorkersFailed,  // a worker failed or stalled: restart if the budget allows
  kStoppedByPeer,  // another node stopped the attempt (multi-node): restart if the budget allows
  kSucceeded,      // every worker exited 0
};

// What was seen during an attempt (on one node, or across the job's nodes for the host).
struct AttemptFacts {
  bool lost_peers = false;  // the job's store could not be reached
  bool start_failed = false;
  int signal = 0;  // the handled signal received, 0: none
  bool workers_failed = false;
  bool peer_stopped = false;  // another node claimed the attempt's stop
};

struct AttemptVerdict {
  AttemptEnd end = AttemptEnd::kSucceeded;
  bool restart = false;  // another attempt follows, using one restart of the budget
};

// Pure. `restart_left`: the budget allows one more restart and nothing rules one out (a worker
// SIGKILL did not end, or one wedged in uninterruptible sleep, holds what a new one would need).
AttemptVerdict decideAttempt(const AttemptFacts& facts, bool restart_left);

// As the event log and the tests spell it: "lost_peers", "start_failed", "signalled",
// "workers_failed", "stopped_by_peer", "succeeded".
const char* attemptEndName(AttemptEnd end);

}  // namespace cpprun::agent
