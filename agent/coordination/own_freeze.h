// OwnFreeze: whether this agent itself was stopped (SIGSTOP, a debugger, a swap storm) long enough
// for the others to end the job without it, told by the gaps between the turns of a loop that
// turns at least every keep-alive interval (the coordinator's watcher).
//
// On the c10d backend the store host's agent serves the job's store: while it is stopped, every
// other agent's requests go unanswered, and an agent whose request waits the keep-alive bound
// counts the store as lost and ends (exit 4). The host, on waking, then finds their heartbeats
// silent. Those members are not the culprits: the host was. A gap longer than the bound is
// remembered, and a member the host finds silent within `recent` of waking is put down to the
// host's own stop (OwnFreeze::recent), which the host reports as such, naming no other node.
// Before, it named a healthy node: "the agent of node 1 stopped responding".
//
// Thread safety: a value of one thread (the watcher).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "common/clock.h"

namespace cpprun::agent {

class OwnFreeze {
 public:
  using Clock = MonotonicClock;
  // `bound`: the silence after which the others count this agent (its store) as lost;
  // `recent`: how long after waking a member's loss is put down to the stop (the time the
  // heartbeat check needs to find them silent: the bound and two intervals).
  // A gap counts when it is longer than the bound and than one and a half intervals (a turn
  // takes one interval and the replies of the agent's own store).
  OwnFreeze(std::chrono::milliseconds interval, std::chrono::milliseconds bound,
            std::chrono::milliseconds recent)
      : threshold_(std::max(bound, interval + interval / 2)), recent_(recent) {}

  // A turn of the loop at `now`.
  void turn(Clock::time_point now);
  // How long this agent was stopped, when it woke from a gap longer than the bound within
  // `recent` before `now`; nullopt otherwise.
  std::optional<Clock::duration> recent(Clock::time_point now) const;

 private:
  std::chrono::milliseconds threshold_;
  std::chrono::milliseconds recent_;
  Clock::time_point last_turn_{};
  Clock::time_point woke_{};
  Clock::duration stopped_{};
};

// "this agent was stopped for 41.2 s, longer than the keep-alive bound (0.9 s): the other
// nodes count the job's store as lost and have ended; the job ended without this node"
std::string ownFreezeMessage(MonotonicClock::duration stopped, std::chrono::milliseconds bound);

}  // namespace cpprun::agent
