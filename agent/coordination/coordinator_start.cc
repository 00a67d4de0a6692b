#include "agent/coordination/coordinator_start.h"

#include <algorithm>
#include <future>

#include "agent/coordination/job_keys.h"
#include "agent/nccl/nccl_id_groups.h"
#include "common/logging.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

using rendezvous::Store;
using rendezvous::StoreTimeout;
using rendezvous::toString;

Result<std::unique_ptr<Store>> StartProtocol::connectWithNotices() {
  const auto deadline = s_.clock().now() + s_.opts.join_timeout;
  WaitAnnouncer announcer(s_, deadline);
  while (true) {
    {
      MutexLock lock(s_.mu);
      if (s_.shutting_down) return internalError("the agent is shutting down");
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - s_.clock().now());
    try {
      return s_.connect(std::max(std::min(left, kNoticeSlice), std::chrono::milliseconds(1)),
                        std::max(s_.keepAliveBound(), s_.opts.keep_alive_interval * 2),
                        /*check_run_id=*/true);
    } catch (const StoreTimeout&) {
      if (s_.clock().now() >= deadline) throw;
      announcer.maybeAnnounce(
          [&] { return "waiting for " + s_.opts.store.server + " to accept connections"; });
    }
  }
}

std::unique_ptr<MemberLiveness> StartProtocol::makeLiveness() {
  LivenessOptions o;
  o.self = s_.opts.self;
  o.interval = s_.opts.keep_alive_interval;
  o.bound = s_.keepAliveBound();
  o.clock = s_.opts.clock;
  o.on_lost = [this](int attempt, const LostMember& lost) { s_.memberLost(attempt, lost); };
  if (s_.opts.store.liveness) return s_.opts.store.liveness(o);
  return std::make_unique<HeartbeatLiveness>(o);
}

Status StartProtocol::join(int n, int* attempt) {
  *attempt = n;
  if (s_.opts.elastic) {
    Result<Membership> m =
        s_.rounds.joinElastic(*s_.control_client, *s_.liveness, s_.next_attempt, attempt);
    if (!m.isOk()) return m.status();
    MutexLock lock(s_.mu);
    s_.membership = std::move(m).value();
    s_.lost_agents.clear();
    s_.unclaimed_losses.clear();
    s_.waiting_claimed = false;
  } else if (!s_.hasMembership()) {
    Result<Membership> m = s_.rounds.joinStatic(*s_.control_client, *s_.liveness);
    if (!m.isOk()) return m.status();
    MutexLock lock(s_.mu);
    s_.membership = std::move(m).value();
  }
  {
    MutexLock lock(s_.mu);
    s_.liveness_attempt = *attempt;
  }
  // A member that read only its assignment: node 0 polls the heartbeats (it has the
  // members); host_per_round, every agent watches every member, and the members are read now
  // unless the liveness reads them when it needs them (etcd: when a lease is lost).
  const bool full = s_.opts.host_per_round && !s_.liveness->readsMembersWhenNeeded();
  Result<Membership> watched =
      full ? s_.fullMembership(*s_.control_client) : s_.currentMembership();
  if (!watched.isOk()) return watched.status();
  s_.liveness->watch(*attempt, watched.value());
  return Status::ok();
}

Result<AttemptStart> StartProtocol::begin(int n, std::vector<std::string>* lost_before_start) {
  if (!s_.control_client) {
    // The first agents may start long before the store's host: keep trying for the join
    // timeout.
    Result<std::unique_ptr<Store>> connected = connectWithNotices();
    if (!connected.isOk()) return connected.status();
    s_.control_client = std::move(connected.value());
  }
  if (!s_.liveness) s_.liveness = makeLiveness();
  int attempt = n;
  if (Status s = join(n, &attempt); !s.isOk()) return s;
  start_watcher_();
  const int world = s_.worldSize();
  std::string go;
  if (s_.isHost()) {
    if (!s_.opts.elastic) {
      // Static: every node must have torn its previous attempt down.
      s_.control_client->set(attemptReadyKey(attempt, s_.myRank()), "1");
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) {
        keys.push_back(attemptReadyKey(attempt, r));
      }
      const Status ready = s_.waitKeys(
          keys, s_.opts.join_timeout,
          "attempt " + std::to_string(attempt) + ": waiting for every node to be ready",
          [&] { return s_.abandonIfAgentLost(); },
          [&] {
            // One CHECK per node: for small jobs only.
            return "attempt " + std::to_string(attempt) + ": " +
                   (world <= kMaxCheckedNodes
                        ? describeMissing(*s_.control_client, keys, s_.opts.expected_hosts,
                                          "to tear their previous attempt down")
                        : "waiting for the " + withThousands(world) +
                              " nodes to tear their previous attempt down");
          });
      if (!ready.isOk()) {
        s_.control_client->set(attemptGoKey(attempt), "!" + ready.message());
        return ready;
      }
    }
    // Elastic: joining the round was the barrier (members join after their teardown).
    Result<std::string> prepared = prepareAndGo(attempt);
    if (!prepared.isOk()) return prepared.status();
    go = prepared.value();
  } else {
    if (!s_.opts.elastic) {
      s_.control_client->set(attemptReadyKey(attempt, s_.myRank()), "1");
    }
    while (true) {
      const Status went = s_.waitKeys(
          {attemptGoKey(attempt)}, s_.opts.join_timeout,
          "attempt " + std::to_string(attempt) + ": waiting for " + s_.deciderName() + "'s go",
          [&] { return s_.deciderLostBeforeGo() ? SliceVerdict::done() : SliceVerdict::goOn(); },
          [&] {
            return "attempt " + std::to_string(attempt) + ": waiting for " + s_.deciderName() +
                   "'s go (every node ready)";
          });
      if (!went.isOk()) return went;
      // The store is asked only when node 0 is lost (one request less per agent otherwise).
      if (!s_.deciderLostBeforeGo() || s_.control_client->check({attemptGoKey(attempt)})) break;
      // Node 0 closed the round and was lost before it started the attempt: nobody got the
      // go, so every member meets again in the next round (no restart used).
      CPPRUN_LOG(kWarn) << "attempt " << attempt << ": " << s_.lostReason(0)
                        << " before it started the attempt; joining the next round";
      s_.next_attempt = attempt + 1;
      if (Status s = join(s_.next_attempt, &attempt); !s.isOk()) return s;
      if (s_.isHost()) {
        Result<std::string> prepared = prepareAndGo(attempt);
        if (!prepared.isOk()) return prepared.status();
        go = prepared.value();
        break;
      }
    }
    if (go.empty()) go = toString(s_.control_client->get(attemptGoKey(attempt)));
    if (!go.empty() && go[0] == '!') return unavailable(go.substr(1));
  }
  // Before the attempt is watched: a node lost meanwhile ends the wait as in the go's.
  Result<std::string> scalable = scalableNcclIds(attempt, go);
  if (!scalable.isOk()) return scalable.status();
  const std::string nccl_ids = scalable.value();
  {
    MutexLock lock(s_.mu);
    s_.watch_attempt = attempt;
    for (const auto& [rank, reason] : s_.lost_agents) lost_before_start->push_back(reason);
  }
  s_.cv.notifyAll();
  return AttemptStart{attempt, s_.currentMembership(), go, nccl_ids};
}

Result<std::string> StartProtocol::scalableNcclIds(int attempt, const std::string& go) {
  if (go.empty() || !s_.opts.make_nccl_id) return std::string();
  const Membership compact = s_.currentMembership();
  const int nid = ncclIdCount(compact.world_size, s_.opts.nccl_ranks_per_id);
  if (nid <= 1) return std::string();
  const Result<Membership> full = s_.fullMembership(*s_.control_client);
  if (!full.isOk()) return full.status();
  const Membership& m = full.value();
  std::vector<int> node_ranks;
  for (const auto& a : m.agents) node_ranks.push_back(a.nproc);
  Status waited;  // the coordinator's wait that did not end well: the attempt's, not the ids'
  auto wait = [&](const std::vector<std::string>& keys) {
    waited = s_.waitKeys(keys, s_.opts.join_timeout,
                         "attempt " + std::to_string(attempt) + ": waiting for the " +
                             std::to_string(nid) + " NCCL ids",
                         [&] { return s_.abandonIfAgentLost(); });
    return waited;
  };
  auto ids = exchangeNcclIds(*s_.control_client, attemptNcclIdsPrefix(attempt), node_ranks,
                             m.group_rank, nid, s_.opts.make_nccl_id, s_.opts.join_timeout, wait);
  if (!waited.isOk()) return waited;
  if (!ids.isOk()) {
    CPPRUN_LOG(kWarn) << "attempt " << attempt << ": " << ids.status().message()
                      << "; CPPRUN_NCCL_UNIQUE_IDS is not set (the workers use the single id)";
    return std::string();
  }
  return joinNcclIds(ids.value());
}

Result<std::string> StartProtocol::prepareAndGo(int attempt) {
  // Every member of this attempt is done with the one before it: what they no longer read goes
  // (stale_job_keys.h), on the loop with the host's preparation where the host serves the store.
  const std::vector<std::string> stale = stale_keys_.started(attempt, s_.currentMembership().round);
  std::function<void()> erase_local;
  if (s_.opts.erase_prefix && !stale.empty()) {
    erase_local = [erase = s_.opts.erase_prefix, run_id = s_.opts.run_id, stale, attempt] {
      size_t erased = 0;
      for (const auto& prefix : stale) erased += erase(namespacedKey(run_id, prefix));
      CPPRUN_LOG(kDebug) << "attempt " << attempt << ": erased " << erased
                         << " job keys of past attempts";
    };
  }
  Result<std::string> prepared = runOnLoop([this, attempt, erase_local] {
    if (erase_local) erase_local();
    return s_.host_prepare(attempt);
  });
  if (!prepared.isOk()) return prepared.status();
  s_.control_client->set(attemptGoKey(attempt), prepared.value());
  if (!s_.opts.erase_prefix) forgetThroughStore(attempt, stale);
  return prepared;
}

void StartProtocol::forgetThroughStore(int attempt, const std::vector<std::string>& stale) {
  int64_t erased = 0;
  try {
    for (const auto& prefix : stale) {
      const int64_t n = s_.control_client->deletePrefix(prefix);
      if (n < 0) {
        CPPRUN_LOG(kDebug) << "the job's store cannot delete by prefix: past attempts' keys stay";
        return;
      }
      erased += n;
    }
  } catch (const rendezvous::StoreError& e) {
    // Not the attempt's failure: the next request of the attempt meets the store's trouble.
    CPPRUN_LOG(kWarn) << "attempt " << attempt
                      << ": could not delete past attempts' keys: " << e.what();
    return;
  }
  if (erased > 0) {
    CPPRUN_LOG(kDebug) << "attempt " << attempt << ": deleted " << erased
                       << " job keys of past attempts";
  }
}

Result<std::string> StartProtocol::runOnLoop(std::function<std::string()> f) {
  auto task = std::make_shared<std::packaged_task<std::string()>>(std::move(f));
  auto result = task->get_future();
  s_.post([task] { (*task)(); });
  while (result.wait_for(s_.opts.keep_alive_interval) != std::future_status::ready) {
    MutexLock lock(s_.mu);
    if (s_.shutting_down) return internalError("the agent is shutting down");
  }
  return result.get();
}

}  // namespace cpprun::agent
