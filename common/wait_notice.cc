#include "common/wait_notice.h"

#include <cstdio>

namespace cpprun {

WaitNotice::WaitNotice(Clock::time_point start, std::chrono::milliseconds first,
                       std::chrono::milliseconds early, std::chrono::milliseconds calm_after,
                       std::chrono::milliseconds late)
    : start_(start), next_(start + first), early_(early), calm_after_(calm_after), late_(late) {}

bool WaitNotice::due(Clock::time_point now) {
  if (now < next_) return false;
  const auto step = (now - start_) < calm_after_ ? early_ : late_;
  while (next_ <= now) next_ += step;
  return true;
}

std::chrono::milliseconds WaitNotice::elapsed(Clock::time_point now) const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - start_);
}

std::string formatWait(std::chrono::milliseconds d) {
  const long long ms = d.count() < 0 ? 0 : d.count();
  char buf[48];
  if (ms < 10000) {
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  } else if (ms < 60000) {
    std::snprintf(buf, sizeof buf, "%lld s", ms / 1000);
  } else if (ms < 3600000) {
    std::snprintf(buf, sizeof buf, "%lld min %lld s", ms / 60000, (ms / 1000) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld h %lld min", ms / 3600000, (ms / 60000) % 60);
  }
  return buf;
}

}  // namespace cpprun
