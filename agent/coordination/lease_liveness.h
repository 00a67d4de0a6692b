// LeaseLiveness: MemberLiveness over etcd leases and watches (the etcd backend's liveness).
//
// The first renew() grants a lease whose TTL is the keep-alive bound (rounded up to whole
// seconds; etcd may raise it to its own minimum) and writes this agent's key
// "<prefix><agent id>" under it; from then on a thread of this object renews the lease every
// keep-alive interval (one request per interval per agent, whatever the job's size), so that
// nothing the coordinator waits for can hold a renewal up. When the lease has expired (this
// agent was stopped or cut off for longer than the TTL, and etcd deleted its key) the thread
// grants a new one and writes the key again, and the next renew() returns false. renew()
// throws StoreTimeout once no renewal has succeeded for `lost_after` (the coordinator's bound
// for etcd lost: the keep-alive bound per endpoint, as for its store requests; an election
// after the leader's loss takes a second or two, and etcd expires no lease meanwhile).
//
// watch(attempt, m) takes a snapshot of which members' keys exist (a member whose key is gone
// is lost at once) and from that snapshot's revision on one thread of this object follows a
// watch of the prefix that carries only deletions (etcd's NOPUT filter): a member's lease
// expiring reaches every agent within etcd's expiry check, without anyone polling anyone.
// The snapshot is read once per attempt, by node 0 (keys only), which publishes it, under its
// lease, at "<prefix without its '/'>.snapshot/<attempt>/<digest of the members' ids>" as
// "<revision>[ <missing rank>,...]"; every other member takes it over (one read, or its thread
// waits for the key) and watches from that revision + 1, which sees every deletion since. So an
// attempt of N agents costs one read of N keys, not N reads of N keys. A member that has no
// snapshot from node 0 within the keep-alive bound (node 0 was lost first, or could not write)
// reads the keys itself. Losses go to LivenessOptions::on_lost with the attempt they belong to.
//
// Failure: a watch that etcd cannot serve is re-armed from the last revision seen (a compacted
// revision, node 0's included: the member reads the keys itself). Give the client a request timeout
// of about one keep-alive interval: a renewal stuck on a member that went silent must fail over to
// the next one well within the TTL.
//
// Thread safety: renew() from any thread; watch() from one thread (the coordinator's control
// thread); poll() returns nothing. The threads are detached on destruction and end at their
// next wake-up (within the keep-alive interval) without calling on_lost again.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/coordination/liveness.h"

namespace cpprun::rendezvous {
class EtcdClient;
}

namespace cpprun::agent {

class LeaseLiveness : public MemberLiveness {
 public:
  // REQUIRES: client != nullptr. `prefix`: full etcd key prefix of the job's liveness keys
  // ("/cpprun/<run id>/alive/"). options.on_lost is required.
  LeaseLiveness(std::shared_ptr<rendezvous::EtcdClient> client, std::string prefix,
                LivenessOptions options, std::chrono::milliseconds lost_after);
  ~LeaseLiveness() override;
  LeaseLiveness(const LeaseLiveness&) = delete;
  LeaseLiveness& operator=(const LeaseLiveness&) = delete;

  bool renew(rendezvous::Store& store) override;
  void watch(int attempt, const Membership& m) override;
  std::vector<LostMember> poll(rendezvous::Store& /*store*/) override { return {}; }
  // The ids when a lease is lost (or node 0's snapshot is missing): the round's members document.
  bool readsMembersWhenNeeded() const override { return true; }

  // Where node 0 publishes its snapshot of attempt `attempt` of `m` (`prefix` as given to the
  // constructor).
  static std::string snapshotKey(const std::string& prefix, int attempt, const Membership& m);

  // The lease's TTL as granted (whole seconds, at least 1).
  std::chrono::seconds ttl() const { return ttl_; }

  struct Shared;  // state shared with the threads (lease_liveness.cc)

 private:
  std::chrono::seconds ttl_;
  std::chrono::milliseconds lost_after_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace cpprun::agent
