// CoordinatorShared: what the parts of the store-backed JobCoordinator share
// (store_job_coordinator.cc: the requests of the loop; coordinator_start.h: the start of an
// attempt; coordinator_decision.h: the reports and the decision; coordinator_watcher.h: the
// watcher thread): the options and the loop's callbacks, the state their threads share (one
// mutex, `mu`, and what it guards), the control thread's connection and counters, the rounds and
// this agent's liveness. It is every wait's WaitContext (coordinator_waits.h).
//
// Threads: the agent's loop (the JobCoordinator methods), the control thread (the loop's requests,
// one at a time), the watcher thread and a liveness backend's own thread (memberLost).
//
// Thread safety: the members marked CPPRUN_GUARDED_BY(mu) need mu (the compiler checks it: the
// thread-safety preset); "control thread" members are the control thread's only; the others are
// set before the threads start, or say which threads use them. The methods take mu themselves
// (CPPRUN_EXCLUDES) and are safe from any thread unless they say otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/coordination/coordinator_waits.h"
#include "agent/coordination/job_coordinator.h"
#include "agent/coordination/job_keys.h"
#include "agent/coordination/liveness.h"
#include "agent/coordination/rendezvous_rounds.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace boost::asio {
class io_context;
}
namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

// What the decider's watcher noted on seeing an attempt's stop: when, and the other members'
// heartbeat counters then (by group rank).
struct StopSeen {
  int attempt = -1;
  MonotonicClock::time_point at{};
  std::map<int, int64_t> beats;
};

class CoordinatorShared : public WaitContext {
 public:
  using Store = rendezvous::Store;

  CoordinatorShared(boost::asio::io_context& io_context, StoreCoordinatorOptions options,
                    JobCoordinator::HostPrepare prepare, JobCoordinator::PeerStop peer_stop,
                    JobCoordinator::Lost lost);
  CoordinatorShared(const CoordinatorShared&) = delete;
  CoordinatorShared& operator=(const CoordinatorShared&) = delete;

  // Runs `f` on the agent's loop. Any thread.
  void post(std::function<void()> f);

  const std::string& storeWhere() const { return opts.store.where; }
  std::string deciderName() const { return opts.host_per_round ? "node 0" : "the store host"; }
  // Heartbeat liveness: members acknowledge stops, the decider gives up the ones that do not
  // (kStopAckBound). Backends with their own liveness (etcd's leases) hear of a loss at once.
  bool acksStops() const { return !opts.store.liveness; }
  const MonotonicClock& clock() override { return *opts.clock; }

  // The decider of the job: the store host, or (host_per_round) the current round's node 0.
  // Control thread, watcher.
  bool isHost() CPPRUN_EXCLUDES(mu);

  // host_per_round: node 0 (this attempt's decider) was lost and this agent is the
  // lowest-ranked member still live, so it decides in node 0's place. Control thread, watcher.
  bool takesOverDecision() CPPRUN_EXCLUDES(mu);

  // This agent's rank and the number of agents in the current membership. Any thread.
  int myRank() CPPRUN_EXCLUDES(mu);
  int worldSize() CPPRUN_EXCLUDES(mu);
  // Whether this agent has joined (the static join is once). Control thread.
  bool hasMembership() CPPRUN_EXCLUDES(mu);
  // REQUIRES: hasMembership(). Any thread.
  Membership currentMembership() CPPRUN_EXCLUDES(mu);

  // The current membership with every member's record. An agent that learnt its round from its
  // own assignment (rendezvous_rounds.h) reads the round's members document the first time it
  // needs them: it decides (node 0 has them already; a member taking the decision over does
  // not), it makes the NCCL ids of a large job, or (etcd) it watches every member's lease.
  // `client`: the calling thread's connection (control thread, watcher). A members document that
  // does not match this agent's assignment: an error.
  Result<Membership> fullMembership(Store& client) CPPRUN_EXCLUDES(mu);

  // How long the store (or an agent) may stay silent before it counts as lost: every store
  // request's reply timeout, and the heartbeat bound.
  std::chrono::milliseconds keepAliveBound() const;

  // A connection to the job's namespace in the store (job_keys.h: "cpprun/<run id>/").
  // `check_run_id` (the control connection, which joins): after checking that the store is not
  // served by another job's agent (that refusal is the error returned). The watcher's connection
  // comes after the join; a failure of its first request is then a lost store, not a refused
  // one. Throws what StoreConnector::connect throws. Control thread, watcher.
  Result<std::unique_ptr<Store>> connect(std::chrono::milliseconds connect_timeout,
                                         std::chrono::milliseconds timeout,
                                         bool check_run_id = false);

  // The store host's agent names its job's run id at the store's root before it answers
  // anyone. An agent of another run id must not join: the store also serves the host's job's
  // workers (MASTER_ADDR:MASTER_PORT) and the host clears their keys before every attempt, so
  // the two jobs would wipe each other's keys. (Before, the agents of both merged into one job
  // whose workers' TORCHELASTIC_RUN_ID differed between nodes.) No name there: a store not
  // served by a cpprun agent of this version; the namespaces still keep the jobs apart.
  Status checkServedRunId(Store& root);

  // WaitContext: every wait of the control thread ends when the store is lost or the agent
  // shuts down. Control thread.
  Status abandonment() override CPPRUN_EXCLUDES(mu);
  void setWaiting(const std::string& what) override CPPRUN_EXCLUDES(mu);
  void setWaitingAsSpare(bool spare) override CPPRUN_EXCLUDES(mu);
  bool leaveRequested() override CPPRUN_EXCLUDES(mu);

  std::string nodeNames(const std::vector<int>& ranks) const;

  // waitForKeys (coordinator_waits.h) in keep-alive-sized slices on the control connection.
  // Control thread.
  [[nodiscard]] Status waitKeys(const std::vector<std::string>& keys,
                                std::chrono::milliseconds total, const std::string& what,
                                const std::function<SliceVerdict()>& on_slice = {},
                                const std::function<std::string()>& describe = {});

  // A wait's slice check: a member lost abandons the wait with the loss. Control thread.
  SliceVerdict abandonIfAgentLost() CPPRUN_EXCLUDES(mu);

  // host_per_round, waiting for the go: node 0, which gives it, is lost. Control thread.
  bool deciderLostBeforeGo() CPPRUN_EXCLUDES(mu);

  // The first claim of attempt n's stop wins (compare-and-set: the store decides who was first).
  // The claim this agent wrote is noted first (ownClaim), so that a claim in its name it did not
  // write is told from its own. Returns the claim stored now (this one when it was first).
  // Control thread, watcher (each with its connection).
  std::string claimStop(Store& client, int n, const StopClaim& stop) CPPRUN_EXCLUDES(mu);
  // Whether `stored`, the bytes of attempt n's stop key, is a claim this agent wrote. Any thread.
  bool ownClaim(int n, const std::string& stored) CPPRUN_EXCLUDES(mu);

  // Why member `rank` was lost, "" when it was not. Any thread.
  std::string lostReason(int rank) CPPRUN_EXCLUDES(mu);

  // A member of `attempt`'s membership is lost (liveness: a poll on the watcher, or a
  // backend's own thread): count it out of the attempt, stop this node's workers if the attempt
  // runs (before it starts: StartProtocol does, or the round is joined again), and have the
  // watcher claim the attempt's stop for it. Any thread.
  void memberLost(int attempt, const LostMember& lost) CPPRUN_EXCLUDES(mu);

  // The store is lost for this agent: waits end with `status` and the loop hears of it, once.
  // Watcher.
  void reportLost(const Status& status) CPPRUN_EXCLUDES(mu);

  // Decider: notes (once per attempt) when it saw attempt n's stop and the other members'
  // heartbeat counters then. The watcher calls it on seeing the stop; the control thread too,
  // when it decides before its watcher got there (this node claimed the stop itself). Returns
  // the note. Either thread, each with its own connection.
  Result<StopSeen> noteStopSeen(Store& client, int n, MonotonicClock::time_point seen_at)
      CPPRUN_EXCLUDES(mu);

  // Set before the threads start.
  boost::asio::io_context& io;
  const StoreCoordinatorOptions opts;
  const JobCoordinator::HostPrepare host_prepare;
  const JobCoordinator::PeerStop on_peer_stop;
  // Called (control thread, outside mu) each time the agent begins waiting as a spare.
  std::function<void()> on_spare_wait;
  const JobCoordinator::Lost on_lost;

  // Shared by the loop (the public methods), the control thread, the watcher thread and a
  // backend's liveness thread (memberLost).
  mutable Mutex mu;
  CondVar cv;  // tasks, watch_attempt, unclaimed_losses, shutting_down
  std::deque<std::function<void()>> tasks CPPRUN_GUARDED_BY(mu);  // the control thread's queue
  bool shutting_down CPPRUN_GUARDED_BY(mu) = false;
  bool job_over CPPRUN_GUARDED_BY(mu) = false;
  int watch_attempt CPPRUN_GUARDED_BY(mu) = -1;  // -2: the watcher must leave
  Status store_status CPPRUN_GUARDED_BY(mu);
  std::string waiting_for CPPRUN_GUARDED_BY(mu);                 // what the control thread awaits
  std::map<int, std::string> lost_agents CPPRUN_GUARDED_BY(mu);  // by group rank
  int liveness_attempt CPPRUN_GUARDED_BY(mu) = -1;               // the attempt liveness watches
  int decided_attempt CPPRUN_GUARDED_BY(mu) = -1;                // the last attempt decided
  bool waiting_as_spare CPPRUN_GUARDED_BY(mu) = false;           // the rounds' spare wait
  bool spare_leave CPPRUN_GUARDED_BY(mu) = false;                // drained while a spare
  // attempt -> the stop claims this agent wrote for it (claimStop).
  std::map<int, std::vector<std::string>> own_claims CPPRUN_GUARDED_BY(mu);
  // (attempt, who): claimed by the watcher.
  std::vector<std::pair<int, LostMember>> unclaimed_losses CPPRUN_GUARDED_BY(mu);
  // Decider: the last attempt whose stop it saw (heartbeat liveness only); written by the
  // watcher or the control thread, whichever saw it first.
  StopSeen stop_seen CPPRUN_GUARDED_BY(mu);
  std::optional<Membership> membership CPPRUN_GUARDED_BY(mu);

  RendezvousRounds rounds{opts, *this};      // control thread; nextRound(), progress(): any
  std::atomic<bool> waiting_claimed{false};  // watcher (host, elastic): joiners announced
  std::unique_ptr<Store> control_client;     // control thread only
  int decision_readers = 0;                  // control thread only
  int next_attempt = 0;                      // control thread only (host)
  int restarts_used = 0;                     // control thread only (host)
  // Last: destroyed first (after the threads are joined), so that a backend's liveness thread
  // never reports into members already gone. Created by the control thread before the watcher
  // starts; used by both.
  std::unique_ptr<MemberLiveness> liveness;
};

}  // namespace cpprun::agent
