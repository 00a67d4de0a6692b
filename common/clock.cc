#include "common/clock.h"

namespace cpprun {

namespace {

class RealClock : public MonotonicClock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const MonotonicClock& realClock() {
  static const RealClock* const clock = new RealClock;
  return *clock;
}

}  // namespace cpprun
