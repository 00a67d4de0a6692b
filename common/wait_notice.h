// WaitNotice: when a wait should be announced again — "cpprun never waits silently", without
// flooding a log. The first notice comes `first` after the wait began, then one every `early`
// until `calm_after`, then one every `late`. Defaults: at 5 s, every 5 s for the first minute,
// then every 30 s (a 600 s join timeout is 29 lines).
//
// Thread safety: a value type; one instance per wait, used by one thread.
#pragma once

#include <chrono>
#include <string>

namespace cpprun {

class WaitNotice {
 public:
  using Clock = std::chrono::steady_clock;
  explicit WaitNotice(Clock::time_point start,
                      std::chrono::milliseconds first = std::chrono::seconds(5),
                      std::chrono::milliseconds early = std::chrono::seconds(5),
                      std::chrono::milliseconds calm_after = std::chrono::seconds(60),
                      std::chrono::milliseconds late = std::chrono::seconds(30));

  // True when a notice is due at `now`; the next one is then scheduled.
  bool due(Clock::time_point now);
  // When the next notice is due (for a timer).
  Clock::time_point next() const { return next_; }
  std::chrono::milliseconds elapsed(Clock::time_point now) const;

 private:
  Clock::time_point start_;
  Clock::time_point next_;
  std::chrono::milliseconds early_;
  std::chrono::milliseconds calm_after_;
  std::chrono::milliseconds late_;
};

// "12 s", "1.5 s" (below 10 s, one decimal), "4 min 3 s", "2 h 5 min".
std::string formatWait(std::chrono::milliseconds d);

}  // namespace cpprun
