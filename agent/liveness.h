// Liveness: how the agents of a job notice silence. Every agent bumps its heartbeat counter in
// the store each keep-alive interval (beat); the host reads the other members' counters and
// declares a member lost when its counter has not moved for the keep-alive bound
// (HeartbeatWatch); an agent whose store requests stay unanswered for the same bound counts the
// store as lost (keepAliveBound is every store request's reply timeout).
//
// A check that comes late (the host's agent was stopped, descheduled or swapping, and the store
// it serves with it) finds the others' beats queued up behind it, unread. That silence is the
// host's own: HeartbeatWatch does not count the delay beyond one interval against the others.
//
// Thread safety: HeartbeatWatch is a value used by one thread (the coordinator's watcher);
// the free functions are safe from any thread (the Store is).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "agent/job_coordinator.h"

namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

// How long the store (or an agent) may stay silent before it counts as lost.
std::chrono::milliseconds keepAliveBound(std::chrono::milliseconds interval, int max_attempt);

// Bumps this agent's heartbeat. Throws what the store throws.
void beat(rendezvous::Store& store, const std::string& agent_id);

// "12.3 s": durations in the protocol's messages.
std::string formatSeconds(std::chrono::steady_clock::duration d);

class HeartbeatWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Silent {
    int rank = 0;        // group rank in the membership checked
    std::string reason;  // "the agent of node 1 (h1) stopped responding: no heartbeat for 15.2 s"
  };

  // `interval`: how often the watch is checked; `bound`: the silence that makes an agent lost.
  HeartbeatWatch(std::chrono::milliseconds interval, std::chrono::milliseconds bound)
      : interval_(interval), bound_(bound) {}

  // Host: reads every member's heartbeat but its own (one multiGet) and returns the members
  // silent for the bound once the read is back (again at every check while they stay silent).
  // Throws what the store throws.
  std::vector<Silent> check(rendezvous::Store& store, const Membership& m);

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

}  // namespace cpprun::agent
