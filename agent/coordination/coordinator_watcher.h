// CoordinatorWatcher: the store coordinator's watcher thread (coordinator_shared.h), on its own
// connection: it waits on the current attempt's stop key (a peer's stop, or this agent declared
// lost, goes to the loop), acknowledges stops (heartbeat liveness), renews this agent's
// liveness, polls the members' where liveness is polled (heartbeats: on the decider, or on every
// agent with host_per_round), claims the stops of lost members and (elastic decider) stops the
// attempt for agents waiting to join. A lost store ends it (reportLost).
//
// A stop claim is untrusted bytes: one that cannot be decoded, one in this node's name that it
// did not write (CoordinatorShared::ownClaim), or an "end of the job" before the attempt's
// decision stops this node as well (the key is taken: no real claim can follow, so a node that
// ignored it would run on unstopped). docs/security.md.
//
// Thread safety: run() and the rest: the watcher thread only.
#pragma once

#include "agent/coordination/coordinator_shared.h"

namespace cpprun::agent {

class CoordinatorWatcher {
 public:
  using Store = rendezvous::Store;

  explicit CoordinatorWatcher(CoordinatorShared& shared) : s_(shared) {}

  // The watcher: this agent's liveness, the current attempt's stop key, the members' liveness
  // where it is polled (heartbeats: on the host, or on every agent with host_per_round),
  // the stop claims for lost members, and (elastic) agents waiting to join.
  void run();

 private:
  // Watcher, on seeing attempt n's stop: tells the decider this agent lives (before its
  // teardown); the decider notes when it saw the stop and the other members' heartbeats then.
  void acknowledgeStop(Store& client, int n);

  // Watcher: acts on attempt n's stop claim (`stored`: the key's bytes).
  void handleStop(Store& client, int n, const std::string& stored);
  // Why the claim `stored` was not written by this job's agents, or "" (it may have been).
  std::string stopTampering(Store& client, int n, const std::string& stored,
                            const Result<StopClaim>& claim);

  // Watcher: the stop claims of the members found lost in started attempts (the first claim of
  // an attempt names its root cause on every node).
  void claimLosses(Store& client);

  // Elastic host: agents that joined the next round while this one runs, and room for them:
  // stop the attempt so the group re-forms with them (no restart budget used).
  void checkJoiners(Store& client, int n);

  CoordinatorShared& s_;
};

}  // namespace cpprun::agent
