#include "agent/supervision/uninterruptible_check.h"

#include <cstdio>
#include <utility>

#include "agent/supervision/stuck_process.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/wait_notice.h"

namespace cpprun::agent {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct UninterruptibleCheck::Timer {
  explicit Timer(boost::asio::io_context& io) : timer(io) {}
  boost::asio::steady_timer timer;
};

UninterruptibleCheck::UninterruptibleCheck(boost::asio::io_context& io, ProcessLauncher& launcher,
                                           std::vector<AttemptWorker>& workers,
                                           milliseconds timeout, EventLog* event_log,
                                           OnTimeout on_timeout)
    : launcher_(launcher),
      workers_(workers),
      timeout_(timeout),
      event_log_(event_log),
      on_timeout_(std::move(on_timeout)),
      timer_(std::make_unique<Timer>(io)) {}

UninterruptibleCheck::~UninterruptibleCheck() = default;

void UninterruptibleCheck::start(int attempt) {
  attempt_ = attempt;
  running_ = true;
  arm();
}

void UninterruptibleCheck::stop() {
  running_ = false;
  timer_->timer.cancel();
}

void UninterruptibleCheck::arm() {
  if (timeout_ <= milliseconds(0)) return;
  timer_->timer.expires_after(uninterruptibleCheckInterval(timeout_));
  timer_->timer.async_wait(
      [this, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !running_) return;
        if (!check()) arm();
      });
}

bool UninterruptibleCheck::check() {
  const auto now = SteadyClock::now();
  std::vector<size_t> timed_out;
  for (size_t i = 0; i < workers_.size(); ++i) {
    AttemptWorker& w = workers_[i];
    if (w.exited || w.pid <= 0) continue;
    const bool was_in_d = w.d_since.has_value();
    const auto dwell = updateDwell(w.d_since, launcher_.stateOf(w.pid), now);
    if (!dwell) continue;
    if (!was_in_d) {
      CPPRUN_LOG(kWarn) << "rank " << w.spec.rank << " (pid " << w.pid
                        << ") entered uninterruptible sleep (D state); the attempt fails if it "
                           "stays there for "
                        << formatWait(timeout_);
      emitEvent(event_log_, "worker_uninterruptible",
                {{"attempt", attempt_},
                 {"rank", w.spec.rank},
                 {"local_rank", w.spec.local_rank},
                 {"pid", w.pid},
                 {"timeout_s", timeout_.count() / 1000.0}});
    }
    if (*dwell >= timeout_) timed_out.push_back(i);
  }
  if (timed_out.empty()) return false;
  std::string ranks;
  for (size_t i : timed_out) {
    AttemptWorker& w = workers_[i];
    StuckProcess p = inspectProcess(w.pid);
    if (p.state == 0) p.state = 'D';  // as the check saw it
    const double seconds = std::chrono::duration<double>(now - w.d_since.value_or(now)).count();
    w.d_timed_out = true;
    w.d_time = std::chrono::system_clock::now();
    char dwell_text[32];
    std::snprintf(dwell_text, sizeof dwell_text, "%.1f s", seconds);
    w.d_message = describeStuck(p) + ": in uninterruptible sleep for " + dwell_text +
                  " (>= --uninterruptible-state-timeout " + formatWait(timeout_) + ")";
    w.d_stack = p.stack;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.spec.rank);
    CPPRUN_LOG(kError) << "rank " << w.spec.rank << ": " << describeStuck(p)
                       << " stuck in uninterruptible sleep for " << dwell_text
                       << "; failing the attempt, no restart";
    nlohmann::json fields = {{"attempt", attempt_},
                             {"rank", w.spec.rank},
                             {"local_rank", w.spec.local_rank},
                             {"seconds", seconds},
                             {"timeout_s", timeout_.count() / 1000.0},
                             {"process", stuckToJson(p)}};
    emitEvent(event_log_, "worker_uninterruptible_timeout", fields);
  }
  running_ = false;
  on_timeout_(ranks);
  return true;
}

}  // namespace cpprun::agent
