// Liveness: how the agents of a job notice that one of them is gone. MemberLiveness is the seam;
// a backend brings its own (StoreConnector::liveness), else the coordinator counts heartbeats:
//
//   HeartbeatLiveness (cpprun's TCP store): every agent bumps its heartbeat counter in the store
//   each keep-alive interval (beat); the host reads the other members' counters and declares a
//   member lost when its counter has not moved for the keep-alive bound (HeartbeatWatch). A check
//   that comes late (the host's agent was stopped, descheduled or swapping, and the store it
//   serves with it) finds the others' beats queued up behind it, unread. That silence is the
//   host's own: HeartbeatWatch does not count the delay beyond one interval against the others.
//
//   LeaseLiveness (etcd, lease_liveness.h): every agent keeps a key alive under an etcd lease;
//   the lease's expiry deletes it and every member's watch hears of it at once. No polling.
//
// Either way, an agent whose store requests stay unanswered for the keep-alive bound counts the
// store as lost (keepAliveBound is every store request's reply timeout).
//
// Thread safety: HeartbeatWatch is a value used by one thread (the coordinator's watcher);
// MemberLiveness says per method; the free functions are safe from any thread (the Store is).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/coordination/job_coordinator.h"
#include "common/clock.h"
#include "common/thread_annotations.h"

namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

// How long the store (or an agent) may stay silent before it counts as lost.
std::chrono::milliseconds keepAliveBound(std::chrono::milliseconds interval, int max_attempt);

// Bumps this agent's heartbeat. Throws what the store throws.
void beat(rendezvous::Store& store, const std::string& agent_id);

// The heartbeat counters of members `ranks` (group ranks of `m`), read in one multiGet; a member
// that has not beaten yet reads 0. Throws what the store throws.
std::map<int, int64_t> readHeartbeats(rendezvous::Store& store, const Membership& m,
                                      const std::vector<int>& ranks);
// The group ranks of every member of `m` but this agent.
std::vector<int> otherMembers(const Membership& m);

// "12.3 s": durations in the protocol's messages.
std::string formatSeconds(std::chrono::steady_clock::duration d);

// A member found gone.
struct LostMember {
  int rank = 0;        // group rank in the membership watched
  std::string reason;  // "the agent of node 1 (h1) stopped responding: no heartbeat for 15.2 s"
};

// How an agent tells the job it lives, and learns which members of its attempt are gone.
class MemberLiveness {
 public:
  virtual ~MemberLiveness() = default;
  // This agent lives: called once when it joins (the control thread, with its connection),
  // before its join record is written, and every keep-alive interval (the watcher thread, with
  // its connection). Returns false when this agent had been given up for lost (its lease
  // expired while it was silent) and has now come back. Throws StoreError / StoreTimeout when
  // the backend cannot be reached.
  virtual bool renew(rendezvous::Store& store) = 0;
  // From now on, watch the members of `m` (the membership of `attempt`, before it starts);
  // ends the watch of any earlier attempt. Control thread. Backends that hear of a loss as it
  // happens report it through LivenessOptions::on_lost, from this call or a thread of their own.
  virtual void watch(int attempt, const Membership& m) = 0;
  // Polled backends: the watched members lost now (again at each call while they stay lost),
  // read on the watcher thread's connection. Event-driven backends return nothing here.
  virtual std::vector<LostMember> poll(rendezvous::Store& store) = 0;
  // Whether watch() takes a membership without the members' records (Membership::agents empty,
  // as an elastic member that read only its own assignment has it) and reads them itself when
  // it needs them. Otherwise every agent that polls or watches every member (host_per_round)
  // is given them: the coordinator reads the round's members document first.
  virtual bool readsMembersWhenNeeded() const { return false; }
};

// What a backend's liveness needs (StoreConnector::liveness).
struct LivenessOptions {
  AgentInfo self;
  std::chrono::milliseconds interval{5000};  // renew() comes this often
  std::chrono::milliseconds bound{15000};    // silence that makes an agent lost
  // Event-driven backends: a member of the watched attempt is lost. Called on any thread,
  // never after the MemberLiveness is destroyed; must not call back into it.
  std::function<void(int attempt, const LostMember&)> on_lost;
  // Where the silences are measured (the coordinator's StoreCoordinatorOptions::clock); not
  // null, must outlive the liveness.
  const MonotonicClock* clock = &realClock();
};

class HeartbeatWatch {
 public:
  using Clock = MonotonicClock;
  using Silent = LostMember;

  // `interval`: how often the watch is checked; `bound`: the silence that makes an agent lost.
  HeartbeatWatch(std::chrono::milliseconds interval, std::chrono::milliseconds bound)
      : interval_(interval), bound_(bound) {}

  // Host: reads every member's heartbeat but its own (one multiGet) and returns the members
  // silent for the bound once the read is back, as `clock` says (again at every check while
  // they stay silent). Throws what the store throws.
  std::vector<Silent> check(rendezvous::Store& store, const Membership& m,
                            const Clock& clock = realClock());

  // The watch itself, without the store: `beats` holds (group rank, counter) of the members
  // read at `now`.
  std::vector<Silent> observe(const Membership& m,
                              const std::vector<std::pair<int, int64_t>>& beats,
                              Clock::time_point now);

 private:
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds bound_;
  std::map<std::string, std::pair<int64_t, Clock::time_point>> seen_;  // agent id -> beat
  Clock::time_point last_check_{};
};

// Heartbeat counters in the job's store (any rendezvous::Store): renew() bumps this agent's,
// poll() runs a HeartbeatWatch over the watched members' (one multiGet). Thread safety:
// renew() from any thread; watch() and poll() may run on different threads (a mutex).
class HeartbeatLiveness : public MemberLiveness {
 public:
  explicit HeartbeatLiveness(const LivenessOptions& options);
  bool renew(rendezvous::Store& store) override;
  void watch(int attempt, const Membership& m) override;
  std::vector<LostMember> poll(rendezvous::Store& store) override;

 private:
  LivenessOptions options_;
  Mutex mu_;
  int attempt_ CPPRUN_GUARDED_BY(mu_) = -1;
  std::optional<Membership> watched_ CPPRUN_GUARDED_BY(mu_);
  int polled_attempt_ = -1;  // poll()'s thread only
  HeartbeatWatch watch_;     // poll()'s thread only
};

}  // namespace cpprun::agent
