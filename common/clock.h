// MonotonicClock: where the parts that measure waits and silences read the time (the job
// coordinator, liveness), so that their tests run on virtual time. realClock() is
// std::chrono::steady_clock; ManualClock is a test's, moved by hand.
//
// Waits still block on real time (a store's wait, a condition variable): a MonotonicClock only
// decides how much of a bound is left and when a silence is long enough. A test on virtual time
// pairs a ManualClock with a store whose waits return at once and move the clock.
//
// Thread safety: now() is safe from any thread, for both.
#pragma once

#include <atomic>
#include <chrono>

namespace cpprun {

class MonotonicClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~MonotonicClock() = default;
  virtual time_point now() const = 0;
};

// std::chrono::steady_clock; one for the process, never destroyed.
const MonotonicClock& realClock();

// Starts at an arbitrary steady_clock time (never time_point{}, which some callers read as
// "never") and moves only by advance().
class ManualClock : public MonotonicClock {
 public:
  ManualClock() : ticks_(std::chrono::steady_clock::now().time_since_epoch().count()) {}
  time_point now() const override { return time_point(duration(ticks_.load())); }
  void advance(duration d) { ticks_.fetch_add(d.count()); }

 private:
  std::atomic<duration::rep> ticks_;
};

}  // namespace cpprun
