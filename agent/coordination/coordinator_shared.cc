#include "agent/coordination/coordinator_shared.h"

#include <algorithm>

#include "agent/coordination/job_decision.h"
#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

namespace cpprun::agent {

using nlohmann::json;
using rendezvous::Store;
using rendezvous::toString;

CoordinatorShared::CoordinatorShared(boost::asio::io_context& io_context,
                                     StoreCoordinatorOptions options,
                                     JobCoordinator::HostPrepare prepare,
                                     JobCoordinator::PeerStop peer_stop, JobCoordinator::Lost lost)
    : io(io_context),
      opts(std::move(options)),
      host_prepare(std::move(prepare)),
      on_peer_stop(std::move(peer_stop)),
      on_lost(std::move(lost)) {}

void CoordinatorShared::post(std::function<void()> f) { boost::asio::post(io, std::move(f)); }

bool CoordinatorShared::isHost() {
  if (!opts.host_per_round) return opts.is_host;
  MutexLock lock(mu);
  return membership && membership->group_rank == 0;
}

bool CoordinatorShared::takesOverDecision() {
  if (!opts.host_per_round) return false;
  MutexLock lock(mu);
  if (!membership || !lost_agents.count(0)) return false;
  for (int r = 0; r < membership->group_world_size; ++r) {
    if (!lost_agents.count(r)) return r == membership->group_rank;
  }
  return false;
}

int CoordinatorShared::myRank() {
  MutexLock lock(mu);
  return membership ? membership->group_rank : opts.group_rank;
}

int CoordinatorShared::worldSize() {
  MutexLock lock(mu);
  return membership ? membership->group_world_size : opts.group_world_size;
}

bool CoordinatorShared::hasMembership() {
  MutexLock lock(mu);
  return membership.has_value();
}

Membership CoordinatorShared::currentMembership() {
  MutexLock lock(mu);
  return *membership;
}

Result<Membership> CoordinatorShared::fullMembership(Store& client) {
  Membership m = currentMembership();
  if (!m.agents.empty() || m.round < 0) return m;
  const nlohmann::json doc = parseRecord(toString(client.get(roundMembersKey(m.round))));
  Result<RoundMembers> members = roundMembersFromJson(doc, m.round);
  if (!members.isOk()) return members.status();
  if (static_cast<int>(members.value().agents.size()) != m.group_world_size) {
    return internalError("rendezvous round " + std::to_string(m.round) + " has " +
                         std::to_string(members.value().agents.size()) +
                         " members in the store, but this node's assignment says " +
                         std::to_string(m.group_world_size));
  }
  m.agents = std::move(members.value().agents);
  MutexLock lock(mu);
  if (membership && membership->round == m.round && membership->agents.empty()) {
    membership->agents = m.agents;
  }
  return m;
}

std::chrono::milliseconds CoordinatorShared::keepAliveBound() const {
  return agent::keepAliveBound(opts.keep_alive_interval, opts.keep_alive_max_attempt);
}

Result<std::unique_ptr<Store>> CoordinatorShared::connect(std::chrono::milliseconds connect_timeout,
                                                          std::chrono::milliseconds timeout,
                                                          bool check_run_id) {
  std::shared_ptr<Store> root = opts.store.connect(connect_timeout, timeout);
  if (check_run_id && !opts.host_per_round) {
    if (Status s = checkServedRunId(*root); !s.isOk()) return s;
  }
  return std::unique_ptr<Store>(
      std::make_unique<rendezvous::PrefixStore>(jobNamespace(opts.run_id), std::move(root)));
}

Status CoordinatorShared::checkServedRunId(Store& root) {
  if (opts.secret.empty() && root.check({rendezvous::kAuthRequiredKey})) {
    return Status(StatusCode::kInvalidArgument,
                  opts.store.server +
                      " requires the job's secret, and this agent has none: give every agent of "
                      "the job the same CPPRUN_RDZV_SECRET or --rdzv-conf secret_file "
                      "(docs/security.md)");
  }
  if (!root.check({kServedRunIdKey})) return Status::ok();
  const std::string served = toString(root.get(kServedRunIdKey));
  const std::string mine = storedRunId(opts.run_id);
  if (served == mine) return Status::ok();
  return Status(
      StatusCode::kAlreadyExists,
      opts.store.server + " serves the job with run id '" + served +
          "', not this agent's job (--rdzv-id '" + mine +
          "'); two jobs cannot share one rendezvous endpoint (its store is also the host's "
          "workers' store): give each job its own --rdzv-endpoint port, or the same --rdzv-id "
          "to the agents of one job");
}

Status CoordinatorShared::abandonment() {
  MutexLock lock(mu);
  if (!store_status.isOk()) return store_status;
  if (shutting_down) return internalError("the agent is shutting down");
  return Status::ok();
}

void CoordinatorShared::setWaiting(const std::string& what) {
  MutexLock lock(mu);
  waiting_for = what;
}

void CoordinatorShared::setWaitingAsSpare(bool spare) {
  {
    MutexLock lock(mu);
    waiting_as_spare = spare;
  }
  if (spare && on_spare_wait) on_spare_wait();
}

bool CoordinatorShared::leaveRequested() {
  MutexLock lock(mu);
  return spare_leave;
}

std::string CoordinatorShared::nodeNames(const std::vector<int>& ranks) const {
  return agent::nodeNames(opts.expected_hosts, ranks);
}

Status CoordinatorShared::waitKeys(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds total, const std::string& what,
                                   const std::function<SliceVerdict()>& on_slice,
                                   const std::function<std::string()>& describe) {
  return waitForKeys(*this, *control_client, keys, total, opts.keep_alive_interval, what, on_slice,
                     describe);
}

SliceVerdict CoordinatorShared::abandonIfAgentLost() {
  MutexLock lock(mu);
  if (lost_agents.empty()) return SliceVerdict::goOn();
  return SliceVerdict::abandon(unavailable(lost_agents.begin()->second));
}

bool CoordinatorShared::deciderLostBeforeGo() {
  if (!opts.host_per_round) return false;
  MutexLock lock(mu);
  return lost_agents.count(0) > 0;
}

std::string CoordinatorShared::claimStop(Store& client, int n, const StopClaim& stop) {
  const std::string doc = stopToJson(stop).dump();
  {
    MutexLock lock(mu);
    // Only the last few attempts' claims can still be read: keep the map small.
    while (!own_claims.empty() && own_claims.begin()->first < n - 2) {
      own_claims.erase(own_claims.begin());
    }
    own_claims[n].push_back(doc);
  }
  return toString(client.compareSet(attemptStopKey(n), {}, rendezvous::toBytes(doc)));
}

bool CoordinatorShared::ownClaim(int n, const std::string& stored) {
  MutexLock lock(mu);
  const auto it = own_claims.find(n);
  return it != own_claims.end() &&
         std::find(it->second.begin(), it->second.end(), stored) != it->second.end();
}

std::string CoordinatorShared::lostReason(int rank) {
  MutexLock lock(mu);
  auto it = lost_agents.find(rank);
  return it == lost_agents.end() ? "" : it->second;
}

void CoordinatorShared::memberLost(int attempt, const LostMember& lost) {
  bool started;
  {
    MutexLock lock(mu);
    // A decided attempt is over: a member missing from the next round (it left, or it is
    // lost after the decision) is left out of that round instead.
    if (attempt != liveness_attempt || attempt <= decided_attempt || job_over || shutting_down) {
      return;
    }
    if (!lost_agents.emplace(lost.rank, lost.reason).second) return;
    unclaimed_losses.push_back({attempt, lost});
    started = watch_attempt == attempt;
  }
  CPPRUN_LOG(kError) << lost.reason;
  cv.notifyAll();
  if (started) {
    const std::string reason = lost.reason;
    post([this, attempt, reason] { on_peer_stop(attempt, reason, 0, false); });
  }
}

void CoordinatorShared::reportLost(const Status& status) {
  {
    MutexLock lock(mu);
    if (job_over || shutting_down || !store_status.isOk()) return;
    store_status = status;
  }
  post([this, status] { on_lost(status); });
}

Result<StopSeen> CoordinatorShared::noteStopSeen(Store& client, int n,
                                                 MonotonicClock::time_point seen_at) {
  {
    MutexLock lock(mu);
    if (stop_seen.attempt == n) return stop_seen;
  }
  const Result<Membership> full = fullMembership(client);
  if (!full.isOk()) return full.status();
  const Membership& m = full.value();
  StopSeen seen{n, seen_at, readHeartbeats(client, m, otherMembers(m))};
  MutexLock lock(mu);
  if (stop_seen.attempt != n) stop_seen = std::move(seen);  // the first note stands
  return stop_seen;
}

}  // namespace cpprun::agent
