// StartProtocol: the start of an attempt, on the store coordinator's control thread
// (coordinator_shared.h): the control connection (retried while the store's host is not up),
// this agent's liveness, the join (a round, or the static join once), the ready/go barrier (the
// decider clears the workers' keys on the loop and says "go" with the NCCL id) and, above
// nccl_ranks_per_id ranks, the exchange of the scalable NCCL ids.
//
// Thread safety: the control thread only.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/coordination/coordinator_shared.h"
#include "agent/coordination/stale_job_keys.h"

namespace cpprun::agent {

class StartProtocol {
 public:
  using Store = rendezvous::Store;

  // `start_watcher` starts the watcher thread (once) after the first join.
  StartProtocol(CoordinatorShared& shared, std::function<void()> start_watcher)
      : s_(shared), start_watcher_(std::move(start_watcher)) {}

  // Attempt n (or, elastic, the attempt of the round this agent joins): the members lost
  // between the round and the start are added to `lost_before_start` (the attempt starts and
  // stops at once for them). Store trouble is thrown (the caller's guarded()).
  Result<AttemptStart> begin(int n, std::vector<std::string>* lost_before_start);

 private:
  // CoordinatorShared::connect(), retried for the join timeout in notice-sized slices, saying what
  // it waits for: an agent started before the store host is a common, and otherwise silent, wait.
  Result<std::unique_ptr<Store>> connectWithNotices();

  // This agent's liveness: the backend's own (etcd: leases), else heartbeats in the store.
  std::unique_ptr<MemberLiveness> makeLiveness();

  // Joins (elastic: a round; static: once) and starts watching the members' liveness for
  // `*attempt`.
  [[nodiscard]] Status join(int n, int* attempt);

  // The attempt's ids for ncclCommInitRankScalable (nccl_id_groups.h), "" at or below the
  // threshold, without NCCL on node 0 (no single id in the go: none anywhere), or when a node
  // could not make its ids or they did not all come (every node then falls back to the single
  // id: a failing node publishes its error in place of its ids, so all see it). A node lost
  // while the others wait for its ids, or ids missing after join_timeout: the attempt fails
  // with that status, as in the wait for the go.
  Result<std::string> scalableNcclIds(int attempt, const std::string& go);

  Result<std::string> runOnLoop(std::function<std::string()> f);

  // The decider's start of `attempt`: the keys of attempts and rounds nobody reads any more go
  // (StaleJobKeys), the host prepares the attempt on the loop, and the go is set with its NCCL
  // id (returned).
  Result<std::string> prepareAndGo(int attempt);
  // Deletes `stale` (prefixes in the job's namespace) through the control connection, where the
  // store can (etcd); a failure is logged, not the attempt's.
  void forgetThroughStore(int attempt, const std::vector<std::string>& stale);

  CoordinatorShared& s_;
  std::function<void()> start_watcher_;
  StaleJobKeys stale_keys_;  // the decider's: what it has deleted
};

}  // namespace cpprun::agent
