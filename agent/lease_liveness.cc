#include "agent/lease_liveness.h"

#include <algorithm>
#include <condition_variable>
#include <optional>
#include <set>
#include <thread>

#include "common/logging.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

using rendezvous::EtcdClient;
using rendezvous::EtcdEvent;
using rendezvous::StoreError;
using rendezvous::StoreTimeout;

namespace {

[[noreturn]] void throwStatus(const std::string& what, const Status& s) {
  const std::string message = what + ": " + s.message();
  if (s.code() == StatusCode::kTimeout || s.code() == StatusCode::kUnavailable) {
    throw StoreTimeout(message);
  }
  throw StoreError(message);
}

std::string memberName(const Membership& m, int rank) {
  return "the agent of node " + std::to_string(rank) + " (" +
         m.agents[static_cast<size_t>(rank)].host + ")";
}

}  // namespace

struct LeaseLiveness::Shared {
  std::shared_ptr<EtcdClient> client;
  std::string prefix;
  std::string key;  // this agent's
  LivenessOptions options;
  std::chrono::seconds ttl{1};

  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;               // guarded by mu
  int attempt = -1;                   // guarded by mu
  std::optional<Membership> members;  // guarded by mu
  std::set<int> reported;             // guarded by mu; ranks reported lost in `attempt`
  int64_t floor = 0;                  // guarded by mu; revisions <= floor: seen by watch()
  int64_t cursor = 0;                 // guarded by mu; the next revision to watch from
  bool resnapshot = false;            // guarded by mu; the cursor was compacted away
  // The lease, renewed by the keep-alive thread.
  int64_t lease = 0;     // guarded by mu
  bool expired = false;  // guarded by mu; found expired since renew() last asked
  std::chrono::steady_clock::time_point renewed{};  // guarded by mu; the last renewal
  std::string renew_error;                          // guarded by mu; the last failure since then

  // REQUIRES: mu held. Reports `rank` of the watched attempt lost, once.
  void lose(int rank, const std::string& reason) {
    if (stopped || !members || rank == members->group_rank) return;
    if (!reported.insert(rank).second) return;
    options.on_lost(attempt, LostMember{rank, reason});
  }

  // REQUIRES: mu held. The member whose liveness key is `full_key`, or -1.
  int rankOfKey(const std::string& full_key) const {
    if (!members || full_key.compare(0, prefix.size(), prefix) != 0) return -1;
    const std::string id = full_key.substr(prefix.size());
    for (size_t r = 0; r < members->agents.size(); ++r) {
      if (members->agents[r].id == id) return static_cast<int>(r);
    }
    return -1;
  }

  // Reads which liveness keys exist and then, at once under the lock, watches `m` (attempt
  // `n`; nullopt: the members already watched) from that read's revision on: a member whose key
  // is missing is lost. Returns false when etcd could not be read; the thread then reads again
  // before it watches.
  bool snapshot(std::optional<std::pair<int, Membership>> next, std::string* error) {
    int64_t revision = 0;
    auto kvs = client->getPrefix(prefix, &revision);
    std::lock_guard<std::mutex> lock(mu);
    if (next) {
      attempt = next->first;
      members = std::move(next->second);
      reported.clear();
    }
    cv.notify_all();
    if (!kvs.isOk()) {
      *error = kvs.status().message();
      resnapshot = true;
      return false;
    }
    std::set<std::string> present;
    for (const auto& kv : kvs.value()) present.insert(kv.key.substr(prefix.size()));
    floor = std::max(floor, revision);
    cursor = std::max(cursor, revision + 1);
    resnapshot = false;
    for (int r = 0; members && r < members->group_world_size; ++r) {
      if (present.count(members->agents[static_cast<size_t>(r)].id)) continue;
      lose(r, memberName(*members, r) + " was lost: its etcd lease (TTL " +
                  std::to_string(ttl.count()) + " s) had expired when attempt " +
                  std::to_string(attempt) + " began");
    }
    return true;
  }

  // The watch thread: deletions under the prefix, from the cursor on.
  void run() {
    auto pause = std::chrono::milliseconds(50);
    while (true) {
      int64_t from = 0;
      bool again = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopped || members.has_value(); });
        if (stopped) return;
        from = cursor;
        again = resnapshot;
      }
      if (again || from == 0) {
        std::string error;
        if (!snapshot(std::nullopt, &error)) backOff(&pause);
        continue;
      }
      auto events = client->watch(prefix, true, from, options.interval, {}, true);
      std::unique_lock<std::mutex> lock(mu);
      if (stopped) return;
      if (!events.isOk()) {
        if (events.status().code() == StatusCode::kNotFound) {
          resnapshot = true;  // compacted: read the keys again
          continue;
        }
        CPPRUN_LOG(kDebug) << "liveness watch: " << events.status().message() << "; again";
        lock.unlock();
        backOff(&pause);
        continue;
      }
      pause = std::chrono::milliseconds(50);
      for (const EtcdEvent& e : events.value()) {
        if (e.kv.mod_revision <= floor) continue;  // before watch()'s read: it accounted for it
        cursor = std::max(cursor, e.kv.mod_revision + 1);
        if (e.type != EtcdEvent::Type::kDelete) continue;
        const int rank = rankOfKey(e.kv.key);
        if (rank < 0) continue;
        lose(rank, memberName(*members, rank) + " was lost: its etcd lease (TTL " +
                       std::to_string(ttl.count()) + " s) expired");
      }
    }
  }

  // REQUIRES: mu not held. A new lease with this agent's key under it.
  Result<int64_t> grantAndWrite() {
    std::chrono::seconds ttl_wanted{0}, ttl_granted{0};
    {
      std::lock_guard<std::mutex> lock(mu);
      ttl_wanted = ttl;
    }
    auto granted = client->grantLease(ttl_wanted, &ttl_granted);
    if (!granted.isOk()) {
      return Status(granted.status().code(), "etcd lease grant: " + granted.status().message());
    }
    auto put = client->put(key, options.self.host, granted.value());
    if (!put.isOk()) {
      return Status(put.status().code(), "etcd put " + key + ": " + put.status().message());
    }
    if (ttl_granted > ttl_wanted) {
      std::lock_guard<std::mutex> lock(mu);
      ttl = ttl_granted;  // etcd's minimum: what the messages name
    }
    return granted.value();
  }

  // The keep-alive thread: renews the lease every interval, on its own, so that nothing the
  // coordinator waits for can hold a renewal up; a lease found expired is granted anew.
  void keepAlive() {
    while (true) {
      int64_t id;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, options.interval, [&] { return stopped; });
        if (stopped) return;
        id = lease;
      }
      auto alive = client->keepAlive(id);
      if (alive.isOk()) {
        std::lock_guard<std::mutex> lock(mu);
        renewed = std::chrono::steady_clock::now();
        renew_error.clear();
        continue;
      }
      if (alive.status().code() != StatusCode::kNotFound) {
        std::lock_guard<std::mutex> lock(mu);
        renew_error = alive.status().message();
        continue;
      }
      CPPRUN_LOG(kWarn) << "this agent's etcd lease expired while it was silent: the other nodes "
                           "count it as lost; "
                           "renewing it";
      auto fresh = grantAndWrite();
      std::lock_guard<std::mutex> lock(mu);
      expired = true;
      if (fresh.isOk()) {
        lease = fresh.value();
        renewed = std::chrono::steady_clock::now();
        renew_error.clear();
      } else {
        renew_error = fresh.status().message();
      }
    }
  }

  // Waits `*pause` (or until stopped), then doubles it up to one keep-alive interval.
  void backOff(std::chrono::milliseconds* pause) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, *pause, [&] { return stopped; });
    *pause = std::min(*pause * 2, std::max(options.interval, std::chrono::milliseconds(50)));
  }
};

LeaseLiveness::LeaseLiveness(std::shared_ptr<EtcdClient> client, std::string prefix,
                             LivenessOptions options, std::chrono::milliseconds lost_after)
    : lost_after_(lost_after), shared_(std::make_shared<Shared>()) {
  const auto bound_ms = std::max<int64_t>(options.bound.count(), 1);
  ttl_ = std::chrono::seconds((bound_ms + 999) / 1000);
  shared_->client = std::move(client);
  shared_->key = prefix + options.self.id;
  shared_->prefix = std::move(prefix);
  shared_->options = std::move(options);
  shared_->ttl = ttl_;
  std::thread([shared = shared_] { shared->run(); }).detach();
}

LeaseLiveness::~LeaseLiveness() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->stopped = true;
  shared_->cv.notify_all();
}

bool LeaseLiveness::renew(rendezvous::Store& /*store*/) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  if (shared_->lease == 0) {
    lock.unlock();
    auto lease = shared_->grantAndWrite();
    if (!lease.isOk()) throwStatus("cannot keep this agent alive in etcd", lease.status());
    lock.lock();
    shared_->lease = lease.value();
    shared_->renewed = std::chrono::steady_clock::now();
    std::thread([shared = shared_] { shared->keepAlive(); }).detach();
    return true;
  }
  // The lease outlives a renewal that failed (and etcd expires no lease while it has no leader);
  // etcd is lost for this agent once none succeeded for lost_after.
  const auto silent = std::chrono::steady_clock::now() - shared_->renewed;
  if (!shared_->renew_error.empty() && silent > lost_after_) {
    throwStatus("no etcd lease renewal for " + formatSeconds(silent),
                unavailable(shared_->renew_error));
  }
  if (!shared_->expired) return true;
  shared_->expired = false;
  return false;
}

void LeaseLiveness::watch(int attempt, const Membership& m) {
  std::string error;
  if (!shared_->snapshot(std::make_pair(attempt, m), &error)) {
    // The thread reads again before it watches; renew() says when etcd is gone for good.
    CPPRUN_LOG(kWarn) << "liveness: cannot read the members' leases yet: " << error;
  }
}

}  // namespace cpprun::agent
