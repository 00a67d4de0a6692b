#include "agent/coordination/own_freeze.h"

#include "agent/coordination/liveness.h"

namespace cpprun::agent {

void OwnFreeze::turn(Clock::time_point now) {
  if (last_turn_ != Clock::time_point{} && now - last_turn_ > threshold_) {
    woke_ = now;
    stopped_ = now - last_turn_;
  }
  last_turn_ = now;
}

std::optional<OwnFreeze::Clock::duration> OwnFreeze::recent(Clock::time_point now) const {
  if (woke_ == Clock::time_point{} || now - woke_ > recent_) return std::nullopt;
  return stopped_;
}

std::string ownFreezeMessage(MonotonicClock::duration stopped, std::chrono::milliseconds bound) {
  return "this agent was stopped for " + formatSeconds(stopped) +
         ", longer than the keep-alive bound (" + formatSeconds(bound) +
         "): the other nodes count the job's store as lost and have ended; the job ended "
         "without this node";
}

}  // namespace cpprun::agent
