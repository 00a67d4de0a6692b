#include "agent/supervision/restart_policy.h"

namespace cpprun::agent {

AttemptVerdict decideAttempt(const AttemptFacts& facts, bool restart_left) {
  AttemptVerdict v;
  if (facts.lost_peers) {
    v.end = AttemptEnd::kLostPeers;
  } else if (facts.start_failed) {
    v.end = AttemptEnd::kStartFailed;
  } else if (facts.signal != 0) {
    v.end = AttemptEnd::kSignalled;
  } else if (facts.workers_failed) {
    v.end = AttemptEnd::kWorkersFailed;
  } else if (facts.peer_stopped) {
    v.end = AttemptEnd::kStoppedByPeer;
  } else {
    v.end = AttemptEnd::kSucceeded;
  }
  v.restart =
      restart_left && (v.end == AttemptEnd::kWorkersFailed || v.end == AttemptEnd::kStoppedByPeer);
  return v;
}

const char* attemptEndName(AttemptEnd end) {
  switch (end) {
    case AttemptEnd::kLostPeers:
      return "lost_peers";
    case AttemptEnd::kStartFailed:
      return "start_failed";
    case AttemptEnd::kSignalled:
      return "signalled";
    case AttemptEnd::kWorkersFailed:
      return "workers_failed";
    case AttemptEnd::kStoppedByPeer:
      return "stopped_by_peer";
    case AttemptEnd::kSucceeded:
      return "succeeded";
  }
  return "unknown";
}

}  // namespace cpprun::agent
