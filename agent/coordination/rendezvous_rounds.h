// RendezvousRounds: how the agents of a job agree on its members — the static join (a fixed
// rank and number of agents: every agent publishes its record and reads everyone's) and the
// elastic rounds (min_nodes..max_nodes agents take slots in round r; the host closes the round
// at max_nodes, or last_call_timeout after min_nodes, and publishes the members in a stable
// order: the scheduler's rank, else the previous round's rank, else join order). Keys:
// job_keys.h. The coordinator (store_job_coordinator.cc) runs it on its control thread.
//
// Hot spares: an agent that finds the job running at MAX nodes (its round closed without it,
// or it came while an attempt of the previous round runs) is a spare. It holds a slot in the
// next round and waits there, with no deadline, until the running attempt is decided (the
// join timeout counts from then); the round it waits in closes only after that, so spares never
// form a group of their own beside the running job. When the round closes, the previous
// round's survivors are waited for (bounded by the last call) and kept before newcomers, so a
// spare replaces a lost or departed node and never a live one.
//
// Thread safety: join*, endRounds: the coordinator's control thread only. nextRound() and
// progress(): any thread.
#pragma once

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/coordination/coordinator_waits.h"
#include "agent/coordination/job_coordinator.h"
#include "agent/coordination/job_keys.h"
#include "agent/coordination/liveness.h"

namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

// A round's members from its candidates (the records in its slots, one per agent): round r-1's
// `survivors` first (a spare takes a lost node's place, never a live one's), then the first to
// join, at most `max_nodes`, always with the closing agent `self_id`; in a stable order: the
// scheduler's rank, else the previous round's rank, else the slot. Pure.
std::vector<RoundMember> selectRoundMembers(std::vector<RoundMember> candidates,
                                            const std::set<std::string>& survivors, int max_nodes,
                                            const std::string& self_id);

class RendezvousRounds {
 public:
  // REQUIRES: `options` and `waits` outlive this object.
  RendezvousRounds(const StoreCoordinatorOptions& options, WaitContext& waits)
      : opts_(options), waits_(waits) {}

  // The functions below return why the rendezvous cannot go on as a Status (the waits'
  // abandonment(), a timeout, a malformed record, the job's end); the store's own exceptions
  // (StoreError, StoreTimeout) are thrown as the store throws them.

  // Static: this agent's membership, once every agent joined (join_timeout; else kTimeout
  // naming the missing nodes).
  // `liveness` is renewed before this agent's record is written (its members must find it
  // alive from the moment they can see it).
  Result<Membership> joinStatic(rendezvous::Store& store, MemberLiveness& liveness);

  // Elastic: joins rounds until this agent is a member of one; returns its membership and sets
  // `attempt` to the job's attempt number for it. `next_attempt` (host): the attempt number the
  // round it closes starts.
  Result<Membership> joinElastic(rendezvous::Store& store, MemberLiveness& liveness,
                                 int next_attempt, int* attempt);

  // Host, elastic: tells agents still waiting to join that the job is over (`outcome`).
  void endRounds(rendezvous::Store& store, const std::string& outcome);

  // The agents whose record is in round r now (while an attempt runs: the spares waiting in
  // the next round; a drained spare empties its slot). Control thread.
  Result<int> waitingIn(rendezvous::Store& store, int r);

  // The round agents join next (elastic; -1 before the first).
  int nextRound() const;
  // What the rendezvous has done (waiting_for is the coordinator's).
  RendezvousProgress progress() const;

 private:
  // How round r closed for this agent: the whole members document (the closer, an agent that
  // came after the close) or only this agent's assignment (everyone else).
  struct RoundResult {
    nlohmann::json members;     // null when `assignment` holds it
    nlohmann::json assignment;  // rdzv/round/<r>/assigned/<slot>
  };
  // A step of closeRound: nullopt to go on to the next step.
  using MaybeClosed = std::optional<RoundResult>;
  // closeRound, in its steps: wait for min_nodes (awaitMinNodes; a round that fails publishes
  // its error), on etcd let the agent in slot min_nodes close it (awaitCloser), the last call
  // (lastCall), then publish the members and every slot's assignment (closeWithMembers).
  Result<RoundResult> closeRound(rendezvous::Store& store, int r, int64_t my_slot,
                                 int next_attempt);
  // Waits (up to `total`) for this agent's assignment in round r, or for the round to close
  // without its slot; returns the assignment. kTimeout when neither came.
  Result<nlohmann::json> awaitAssignment(rendezvous::Store& store, int r, int64_t slot,
                                         std::chrono::milliseconds total);
  int64_t takeSlot(rendezvous::Store& store, int r, const std::string& record);
  void started(int round);
  void completed(int round, const Membership& m);
  // Before round r is closed or waited for: when round r-1's attempt still runs, this agent is
  // a spare and waits (no deadline) until that attempt is decided, a member of round r-1 joins
  // round r, or (etcd) no member of round r-1 is alive. Records who round r-1's members were
  // and how many of them will come back (previous_ids_, expected_survivors_).
  // A spare asked to leave (WaitContext::leaveRequested) empties its slot `my_slot` and returns
  // kAlreadyExists (kLeftWhileSpare); one that finds the job over, kJobOverBeforeJoin.
  // `survivor_may_skip`: an agent that was a member of round r-1 and does not close round r
  // needs none of this (it read r-1's decision); it reads nothing (previous_unread_).
  Status waitForRunningRound(rendezvous::Store& store, int r, int64_t my_slot,
                             bool survivor_may_skip = true);
  // waitForRunningRound's end: round r-1's decision (attempt `attempt`) read; the job's end
  // returned, or how many survivors come back (expected_survivors_).
  Status readRunningDecision(rendezvous::Store& store, int r, int attempt);
  bool survivorNotClosing(int r, int64_t my_slot) const;
  // closeRound's last call when round r-1's survivors are known: until they all joined and
  // max_nodes are in, bounded by last_call_timeout.
  Status lastCallForSurvivors(rendezvous::Store& store, int r);
  // closeRound's steps (see the .cc). nullopt: go on to the next step.
  Result<MaybeClosed> awaitMinNodes(rendezvous::Store& store, int r);
  Result<MaybeClosed> awaitCloser(rendezvous::Store& store, int r, int64_t my_slot);
  Status lastCall(rendezvous::Store& store, int r);
  Result<nlohmann::json> closeWithMembers(rendezvous::Store& store, int r, int next_attempt);

  const StoreCoordinatorOptions& opts_;
  WaitContext& waits_;
  int previous_rank_ = -1;  // control thread only
  // Round r-1's members' ids, and how many of them read its decision and will join round r
  // (-1: unknown, e.g. no decision). Set by waitForRunningRound; control thread only.
  std::set<std::string> previous_ids_;
  int expected_survivors_ = -1;
  int previous_attempt_ = -1;     // round r-1's attempt (-1: none)
  bool previous_unread_ = false;  // waitForRunningRound skipped round r-1's members (a survivor)
  int last_round_ = -1;           // the round of this agent's last membership (-1: none)
  int last_attempt_ = -1;         // its attempt

  mutable std::mutex mu_;
  int next_round_ = -1;                                  // guarded by mu_
  RendezvousProgress progress_;                          // guarded by mu_
  std::chrono::steady_clock::time_point round_began_{};  // guarded by mu_
};

}  // namespace cpprun::agent
