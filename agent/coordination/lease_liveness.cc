#include "agent/coordination/lease_liveness.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>

#include "agent/coordination/job_keys.h"
#include "common/logging.h"
#include "common/thread_annotations.h"
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

// "the agent of node 3 (host)"; without the host when this agent has not read the members.
std::string memberName(const Membership& m, int rank) {
  const std::string name = "the agent of node " + std::to_string(rank);
  if (rank < 0 || static_cast<size_t>(rank) >= m.agents.size()) return name;
  return name + " (" + m.agents[static_cast<size_t>(rank)].host + ")";
}

// Node 0's snapshot "<revision>[ <rank>,<rank>...]": the revision it read the members' keys at
// and the ranks whose key was missing. False when it is malformed or names a rank outside
// 0..world-1.
bool parseSnapshot(const std::string& doc, int world, int64_t* revision,
                   std::vector<int>* missing) {
  const char* p = doc.data();
  const char* end = doc.data() + doc.size();
  auto r = std::from_chars(p, end, *revision);
  if (r.ec != std::errc() || *revision <= 0) return false;
  p = r.ptr;
  if (p == end) return true;
  if (*p++ != ' ') return false;
  while (true) {
    int rank = -1;
    r = std::from_chars(p, end, rank);
    if (r.ec != std::errc() || rank < 0 || rank >= world) return false;
    missing->push_back(rank);
    p = r.ptr;
    if (p == end) return true;
    if (*p++ != ',') return false;
  }
}

// Names one membership (its ids in rank order), so that a snapshot is only ever taken over by
// the agents of the membership it was read for. A member that read only its own assignment has
// the digest from there (the closer computed it from the same ids).
std::string membershipDigest(const Membership& m) {
  if (!m.members_digest.empty() && m.agents.empty()) return m.members_digest;
  return membersDigest(m.agents);
}

// Whether `events` hold a deletion after revision `floor` (a member may be lost).
bool deletionAfter(const std::vector<EtcdEvent>& events, int64_t floor) {
  for (const EtcdEvent& e : events) {
    if (e.type == EtcdEvent::Type::kDelete && e.kv.mod_revision > floor) return true;
  }
  return false;
}

}  // namespace

struct LeaseLiveness::Shared {
  std::shared_ptr<EtcdClient> client;
  std::string prefix;
  std::string key;  // this agent's
  LivenessOptions options;

  const MonotonicClock& clock() const { return *options.clock; }

  // Everything below is shared by the constructor's caller (renew(), watch()), the watch thread
  // and the keep-alive thread.
  Mutex mu;
  CondVar cv;
  std::chrono::seconds ttl CPPRUN_GUARDED_BY(mu){1};
  bool stopped CPPRUN_GUARDED_BY(mu) = false;
  int attempt CPPRUN_GUARDED_BY(mu) = -1;
  std::optional<Membership> members CPPRUN_GUARDED_BY(mu);
  // The etcd key of the watched round's members document (members->agents is empty until a
  // loss needs the members' ids: ensureAgents reads it then).
  std::string members_key CPPRUN_GUARDED_BY(mu);
  std::set<int> reported CPPRUN_GUARDED_BY(mu);   // ranks reported lost in `attempt`
  int64_t floor CPPRUN_GUARDED_BY(mu) = 0;        // revisions <= floor: seen by watch()
  int64_t cursor CPPRUN_GUARDED_BY(mu) = 0;       // the next revision to watch from
  bool resnapshot CPPRUN_GUARDED_BY(mu) = false;  // the cursor was compacted away
  // From watch() until the attempt's snapshot is applied (begin()): true; `awaited` is node 0's
  // snapshot key when this agent takes that one over (empty: watch() reads the keys itself).
  bool pending CPPRUN_GUARDED_BY(mu) = false;
  std::string awaited CPPRUN_GUARDED_BY(mu);
  MonotonicClock::time_point awaited_until CPPRUN_GUARDED_BY(mu){};
  // The lease, renewed by the keep-alive thread.
  int64_t lease CPPRUN_GUARDED_BY(mu) = 0;
  bool expired CPPRUN_GUARDED_BY(mu) = false;  // found expired since renew() last asked
  MonotonicClock::time_point renewed CPPRUN_GUARDED_BY(mu){};  // the last renewal
  std::string renew_error CPPRUN_GUARDED_BY(mu);               // the last failure since then

  // Reports `rank` of the watched attempt lost, once. Watch thread, or watch()'s caller.
  void lose(int rank, const std::string& reason) CPPRUN_REQUIRES(mu) {
    if (stopped || !members || rank == members->group_rank) return;
    if (!reported.insert(rank).second) return;
    options.on_lost(attempt, LostMember{rank, reason});
  }

  // The member whose liveness key is `full_key`, or -1.
  int rankOfKey(const std::string& full_key) const CPPRUN_REQUIRES(mu) {
    if (!members || full_key.compare(0, prefix.size(), prefix) != 0) return -1;
    const std::string id = full_key.substr(prefix.size());
    for (size_t r = 0; r < members->agents.size(); ++r) {
      if (members->agents[r].id == id) return static_cast<int>(r);
    }
    return -1;
  }

  // Attempt `n` of `m` begins: nothing reported yet and no snapshot yet, so
  // the watch thread drops what its watch brings until one is applied (it rewinds the cursor).
  // `awaited`: node 0's snapshot key, which the thread fetches until options.bound from now
  // (then it reads the keys itself); empty: the caller reads them. watch()'s caller.
  void begin(int n, Membership m, std::string awaited_key) CPPRUN_REQUIRES(mu) {
    attempt = n;
    members_key.clear();
    const size_t alive = prefix.rfind(kAliveKeyPrefix);
    if (m.agents.empty() && m.round >= 0 && alive != std::string::npos) {
      members_key = prefix.substr(0, alive) + roundMembersKey(m.round);
    }
    members = std::move(m);
    reported.clear();
    pending = true;
    awaited = std::move(awaited_key);
    awaited_until = clock().now() + options.bound;
    cv.notifyAll();
  }

  // The snapshot taken at `revision`: the members in `missing` are lost, and
  // the watch goes on from revision + 1 (a rewind when node 0 read before this agent's cursor:
  // the deletions since are seen again, for this attempt's members). Watch thread, or watch()'s
  // caller.
  void apply(int64_t revision, const std::vector<int>& missing) CPPRUN_REQUIRES(mu) {
    floor = revision;
    cursor = revision + 1;
    pending = false;
    awaited.clear();
    resnapshot = false;
    for (int r : missing) {
      lose(r, memberName(*members, r) + " was lost: its etcd lease (TTL " +
                  std::to_string(ttl.count()) + " s) had expired when attempt " +
                  std::to_string(attempt) + " began");
    }
    cv.notifyAll();
  }

  // A member that read only its own assignment reads the round's members
  // document when it first needs their ids (a loss, or node 0's snapshot missing): one read of
  // N records on the rare path, none on the usual one. False when they cannot be read. Watch
  // thread, or watch()'s caller.
  bool ensureAgents() CPPRUN_EXCLUDES(mu) {
    std::string doc_key;
    int n = -1;
    {
      MutexLock lock(mu);
      if (!members || !members->agents.empty()) return true;
      if (members_key.empty()) return false;
      doc_key = members_key;
      n = attempt;
    }
    auto got = client->get(doc_key);
    if (!got.isOk() || !got.value()) return false;
    MutexLock lock(mu);
    if (attempt != n || !members || !members->agents.empty()) return true;
    Result<RoundMembers> read =
        roundMembersFromJson(parseRecord(got.value()->value), members->round);
    if (!read.isOk() || static_cast<int>(read.value().agents.size()) != members->group_world_size) {
      CPPRUN_LOG(kWarn) << "liveness: round " << members->round << "'s members at " << key
                        << " do not match this node's assignment";
      return false;
    }
    members->agents = std::move(read.value().agents);
    return true;
  }

  // Reads which liveness keys exist (their names only) and applies that. Returns the snapshot
  // as node 0 publishes it ("<revision>[ <rank>,<rank>...]"), or nullopt when etcd could not be
  // read: the thread then reads again before it watches. Watch thread, or watch()'s caller
  // (node 0).
  std::optional<std::string> snapshotOwn(std::string* error) CPPRUN_EXCLUDES(mu) {
    if (!ensureAgents()) {
      *error = "cannot read the round's members";
      MutexLock lock(mu);
      resnapshot = true;
      return std::nullopt;
    }
    int64_t revision = 0;
    auto kvs = client->getPrefix(prefix, &revision, /*keys_only=*/true);
    MutexLock lock(mu);
    if (!kvs.isOk()) {
      *error = kvs.status().message();
      pending = false;
      awaited.clear();
      resnapshot = true;
      cv.notifyAll();
      return std::nullopt;
    }
    std::set<std::string> present;
    for (const auto& kv : kvs.value()) present.insert(kv.key.substr(prefix.size()));
    std::vector<int> missing;
    std::string doc = std::to_string(revision);
    for (int r = 0; members && r < members->group_world_size; ++r) {
      if (present.count(members->agents[static_cast<size_t>(r)].id)) continue;
      doc += (missing.empty() ? " " : ",") + std::to_string(r);
      missing.push_back(r);
    }
    apply(revision, missing);
    return doc;
  }

  // Node 0's snapshot `doc`, read from `snapshot_key`: applied when this agent still awaits that
  // one. A malformed one makes the thread read the keys itself. Watch thread.
  void takeSnapshot(const std::string& snapshot_key, const std::string& doc) CPPRUN_EXCLUDES(mu) {
    MutexLock lock(mu);
    takeSnapshotLocked(snapshot_key, doc);
  }
  // takeSnapshot(), with mu held. watch()'s caller.
  void takeSnapshotLocked(const std::string& snapshot_key, const std::string& doc)
      CPPRUN_REQUIRES(mu) {
    if (!pending || awaited != snapshot_key || !members) return;
    int64_t revision = 0;
    std::vector<int> missing;
    if (!parseSnapshot(doc, members->group_world_size, &revision, &missing)) {
      CPPRUN_LOG(kWarn) << "liveness: node 0's snapshot '" << doc << "' at " << snapshot_key
                        << " is malformed; reading the members' keys";
      pending = false;
      awaited.clear();
      resnapshot = true;
      cv.notifyAll();
      return;
    }
    apply(revision, missing);
  }

  // The watch thread, while it awaits node 0's snapshot at `snapshot_key`: one read, and while it
  // is missing a watch of the key for at most one interval. Past `until`, the thread reads the
  // members' keys itself (node 0 was lost before it wrote, or could not write).
  void awaitSnapshot(const std::string& snapshot_key, MonotonicClock::time_point until,
                     std::chrono::milliseconds* pause) CPPRUN_EXCLUDES(mu) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock().now());
    if (left.count() <= 0) {
      MutexLock lock(mu);
      if (!pending || awaited != snapshot_key) return;
      CPPRUN_LOG(kDebug) << "liveness: no snapshot from node 0 at " << snapshot_key
                         << "; reading the members' keys";
      pending = false;
      awaited.clear();
      resnapshot = true;
      return;
    }
    int64_t revision = 0;
    auto got = client->get(snapshot_key, &revision);
    if (!got.isOk()) {
      backOff(pause);
      return;
    }
    if (got.value()) {
      // Ranks lost before the attempt began: name them with their hosts.
      if (got.value()->value.find(' ') != std::string::npos) ensureAgents();
      takeSnapshot(snapshot_key, got.value()->value);
      return;
    }
    auto events =
        client->watch(snapshot_key, false, revision + 1, std::min(left, options.interval));
    if (!events.isOk()) return;  // read again (and check the deadline)
    for (const EtcdEvent& e : events.value()) {
      if (e.type == EtcdEvent::Type::kPut) {
        if (e.kv.value.find(' ') != std::string::npos) ensureAgents();
        takeSnapshot(snapshot_key, e.kv.value);
        return;
      }
    }
  }

  // The watch thread: deletions under the prefix, from the cursor on.
  void run() CPPRUN_EXCLUDES(mu) {
    auto pause = std::chrono::milliseconds(50);
    while (true) {
      int64_t from = 0;
      bool again = false;
      std::string snapshot_key;
      MonotonicClock::time_point until{};
      {
        MutexLock lock(mu);
        cv.wait(mu, [&] {
          mu.assertHeld();
          return stopped || (members.has_value() && !ownReadPending());
        });
        if (stopped) return;
        from = cursor;
        again = resnapshot;
        if (pending) {
          snapshot_key = awaited;
          until = awaited_until;
        }
      }
      if (!snapshot_key.empty()) {
        awaitSnapshot(snapshot_key, until, &pause);
        continue;
      }
      if (again || from == 0) {
        std::string error;
        if (!snapshotOwn(&error)) backOff(&pause);
        continue;
      }
      auto events = client->watch(prefix, true, from, options.interval, {}, true);
      // A deletion needs the members' ids (which member it was): read them first, unlocked;
      // when they cannot be read, the same revisions are watched again.
      if (events.isOk() && deletionAfter(events.value(), 0) && !ensureAgents()) {
        backOff(&pause);
        continue;
      }
      MutexLock lock(mu);
      if (stopped) return;
      if (pending) continue;  // a new attempt began: its snapshot sets the cursor
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
      lostIn(events.value());
    }
  }

  // watch() reads the keys itself (node 0) and has not applied them yet.
  bool ownReadPending() const CPPRUN_REQUIRES(mu) { return pending && awaited.empty(); }

  // The deletions among `events` after the snapshot: members lost. Watch thread.
  void lostIn(const std::vector<EtcdEvent>& events) CPPRUN_REQUIRES(mu) {
    for (const EtcdEvent& e : events) {
      if (e.kv.mod_revision <= floor) continue;  // before the snapshot: it accounted for it
      cursor = std::max(cursor, e.kv.mod_revision + 1);
      if (e.type != EtcdEvent::Type::kDelete) continue;
      const int rank = rankOfKey(e.kv.key);
      if (rank < 0) continue;
      lose(rank, memberName(*members, rank) + " was lost: its etcd lease (TTL " +
                     std::to_string(ttl.count()) + " s) expired");
    }
  }

  // A new lease with this agent's key under it. Keep-alive thread, or the first renew()'s caller.
  Result<int64_t> grantAndWrite() CPPRUN_EXCLUDES(mu) {
    std::chrono::seconds ttl_wanted{0}, ttl_granted{0};
    {
      MutexLock lock(mu);
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
      MutexLock lock(mu);
      ttl = ttl_granted;  // etcd's minimum: what the messages name
    }
    return granted.value();
  }

  // The keep-alive thread: renews the lease every interval, on its own, so that nothing the
  // coordinator waits for can hold a renewal up; a lease found expired is granted anew.
  void keepAlive() CPPRUN_EXCLUDES(mu) {
    while (true) {
      int64_t id;
      {
        MutexLock lock(mu);
        cv.waitFor(mu, options.interval, [&] {
          mu.assertHeld();
          return stopped;
        });
        if (stopped) return;
        id = lease;
      }
      auto alive = client->keepAlive(id);
      if (alive.isOk()) {
        MutexLock lock(mu);
        renewed = clock().now();
        renew_error.clear();
        continue;
      }
      if (alive.status().code() != StatusCode::kNotFound) {
        MutexLock lock(mu);
        renew_error = alive.status().message();
        continue;
      }
      CPPRUN_LOG(kWarn) << "this agent's etcd lease expired while it was silent: the other nodes "
                           "count it as lost; "
                           "renewing it";
      auto fresh = grantAndWrite();
      MutexLock lock(mu);
      expired = true;
      if (fresh.isOk()) {
        lease = fresh.value();
        renewed = clock().now();
        renew_error.clear();
      } else {
        renew_error = fresh.status().message();
      }
    }
  }

  // Waits `*pause` (or until stopped), then doubles it up to one keep-alive interval. Watch
  // thread.
  void backOff(std::chrono::milliseconds* pause) CPPRUN_EXCLUDES(mu) {
    MutexLock lock(mu);
    cv.waitFor(mu, *pause, [&] {
      mu.assertHeld();
      return stopped;
    });
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
  {
    MutexLock lock(shared_->mu);
    shared_->ttl = ttl_;
  }
  std::thread([shared = shared_] { shared->run(); }).detach();
}

LeaseLiveness::~LeaseLiveness() {
  MutexLock lock(shared_->mu);
  shared_->stopped = true;
  shared_->cv.notifyAll();
}

bool LeaseLiveness::renew(rendezvous::Store& /*store*/) {
  MutexLock lock(shared_->mu);
  if (shared_->lease == 0) {
    lock.unlock();
    auto lease = shared_->grantAndWrite();
    if (!lease.isOk()) throwStatus("cannot keep this agent alive in etcd", lease.status());
    lock.lock();
    shared_->lease = lease.value();
    shared_->renewed = shared_->clock().now();
    std::thread([shared = shared_] { shared->keepAlive(); }).detach();
    return true;
  }
  // The lease outlives a renewal that failed (and etcd expires no lease while it has no leader);
  // etcd is lost for this agent once none succeeded for lost_after.
  const auto silent = shared_->clock().now() - shared_->renewed;
  if (!shared_->renew_error.empty() && silent > lost_after_) {
    throwStatus("no etcd lease renewal for " + formatSeconds(silent),
                unavailable(shared_->renew_error));
  }
  if (!shared_->expired) return true;
  shared_->expired = false;
  return false;
}

std::string LeaseLiveness::snapshotKey(const std::string& prefix, int attempt,
                                       const Membership& m) {
  return aliveSnapshotKey(prefix, attempt, membershipDigest(m));
}

// Node 0 reads which members' keys exist and publishes what it read under its lease; every
// other member takes that over (one read, or the watch thread waits for it), so the job reads
// its N keys once per attempt, not once per agent.
void LeaseLiveness::watch(int attempt, const Membership& m) {
  const std::string key = snapshotKey(shared_->prefix, attempt, m);
  if (m.group_rank != 0) {
    // Read before the thread is told (it would read too): usually node 0 has written it; else
    // the thread waits for it.
    auto got = shared_->client->get(key);
    MutexLock lock(shared_->mu);
    shared_->begin(attempt, m, key);
    if (!got.isOk() || !got.value()) return;
    if (got.value()->value.find(' ') != std::string::npos) {
      lock.unlock();
      shared_->ensureAgents();  // ranks lost already: named with their hosts
      lock.lock();
    }
    shared_->takeSnapshotLocked(key, got.value()->value);
    return;
  }
  int64_t lease = 0;
  {
    MutexLock lock(shared_->mu);
    shared_->begin(attempt, m, "");
    lease = shared_->lease;
  }
  std::string error;
  auto doc = shared_->snapshotOwn(&error);
  if (!doc) {
    // The thread reads again before it watches; renew() says when etcd is gone for good.
    // The others read the keys themselves once they waited for this snapshot in vain.
    CPPRUN_LOG(kWarn) << "liveness: cannot read the members' leases yet: " << error;
    return;
  }
  if (m.group_world_size < 2) return;
  auto put = shared_->client->put(key, *doc, lease);
  if (!put.isOk()) {
    CPPRUN_LOG(kWarn) << "liveness: cannot publish the members' leases to the other nodes ("
                      << put.status().message() << "); they read them themselves";
  }
}

}  // namespace cpprun::agent
