#include "agent/supervision/attempt_teardown.h"

#include <signal.h>

#include <string>
#include <utility>

#include "agent/console/stdin_forwarder.h"
#include "agent/supervision/failure_report.h"
#include "agent/supervision/stuck_process.h"
#include "common/asio.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;
using SystemClock = std::chrono::system_clock;
using std::chrono::milliseconds;

namespace {

// At the reap bound, a worker that is already dead (a zombie, or gone) but not yet reported by
// the reaper is looked at once more this much later instead of being reported as stuck.
constexpr milliseconds kReapRecheck{100};

// A timer's completion that runs `f` only when the wait completed and `alive` still exists.
template <typename F>
auto whileAlive(const std::shared_ptr<char>& alive, F f) {
  return [alive = std::weak_ptr<char>(alive), f](const boost::system::error_code& ec) {
    if (!ec && !alive.expired()) f();
  };
}

}  // namespace

struct AttemptTeardown::Timers {
  explicit Timers(asio::io_context& io) : stop(io), notice(io), reap(io), drain(io) {}
  asio::steady_timer stop;    // SIGKILL at shutdown_timeout
  asio::steady_timer notice;  // "waiting for N workers"
  asio::steady_timer reap;    // the reap bound after SIGKILL
  asio::steady_timer drain;   // the drain bound
};

AttemptTeardown::AttemptTeardown(asio::io_context& io, ProcessLauncher& launcher,
                                 std::vector<AttemptWorker>& workers, Options options,
                                 Callbacks callbacks)
    : launcher_(launcher),
      workers_(workers),
      options_(options),
      callbacks_(std::move(callbacks)),
      timers_(std::make_unique<Timers>(io)) {}

AttemptTeardown::~AttemptTeardown() = default;

bool AttemptTeardown::allExited() const {
  for (const AttemptWorker& w : workers_) {
    if (!w.exited) return false;
  }
  return true;
}

void AttemptTeardown::beginStop(int signo, int attempt) {
  phase_ = Phase::kStopping;
  attempt_ = attempt;
  stop_signal_ = signo;
  signalWorkers(signo);
  // A stopped worker (SIGSTOP, a debugger) cannot act on SIGTERM: wake it to receive it.
  if (signo == SIGTERM) signalWorkers(SIGCONT);
  if (allExited()) {
    beginDrain();
    return;
  }
  stop_began_ = SteadyClock::now();
  stop_notice_ = WaitNotice(stop_began_);
  armStopNotice();
  if (signo == SIGKILL) {
    sent_kill_ = true;
    armReapTimer();
    return;
  }
  timers_->stop.expires_after(options_.shutdown_timeout);
  timers_->stop.async_wait(whileAlive(alive_, [this] {
    if (phase_ == Phase::kStopping) onStopTimeout();
  }));
}

// While a teardown waits, say on what (bounded in volume by WaitNotice).
void AttemptTeardown::armStopNotice() {
  timers_->notice.expires_at(stop_notice_.next());
  timers_->notice.async_wait(whileAlive(alive_, [this] {
    if (phase_ != Phase::kStopping) return;
    const auto now = SteadyClock::now();
    if (stop_notice_.due(now)) announceStopWait(now);
    armStopNotice();
  }));
}

void AttemptTeardown::announceStopWait(SteadyClock::time_point now) {
  int left = 0;
  for (const AttemptWorker& w : workers_) left += w.exited ? 0 : 1;
  const auto waited = std::chrono::duration_cast<milliseconds>(now - stop_began_);
  std::string text = "waiting for " + std::to_string(left) + " of " +
                     std::to_string(workers_.size()) + " workers (ranks " + runningRanks(workers_) +
                     ") to exit after " + signalName(stop_signal_) + " for " + formatWait(waited);
  if (!sent_kill_) {
    text += ", SIGKILL in " + formatWait(options_.shutdown_timeout - waited);
  } else {
    text +=
        "; SIGKILL sent (a process in uninterruptible sleep waits for the kernel; given up "
        "on " +
        formatWait(options_.reap_timeout) + " after SIGKILL)";
  }
  CPPRUN_LOG(kWarn) << text;
}

void AttemptTeardown::onStopTimeout() {
  sent_kill_ = true;
  CPPRUN_LOG(kWarn) << "ranks " << runningRanks(workers_) << " still running "
                    << options_.shutdown_timeout.count() / 1000.0 << " s after "
                    << signalName(stop_signal_) << "; sending SIGKILL";
  signalWorkers(SIGKILL);
  armReapTimer();
}

// The reap bound: a worker SIGKILL has not ended by then is given up on (onReapTimeout).
void AttemptTeardown::armReapTimer() {
  kill_sent_at_ = SteadyClock::now();
  reap_rechecked_ = false;
  timers_->reap.expires_after(options_.reap_timeout);
  timers_->reap.async_wait(whileAlive(alive_, [this] {
    if (phase_ == Phase::kStopping) onReapTimeout();
  }));
}

// Everything killable has had SIGKILL; what is still alive cannot be waited for without a
// bound. Name it (pid, state, wchan, stack) and go on without it: the job ends with exit 7.
void AttemptTeardown::onReapTimeout() {
  const double waited = std::chrono::duration<double>(SteadyClock::now() - kill_sent_at_).count();
  bool reaping = false;
  for (AttemptWorker& w : workers_) {
    if (w.exited || w.pid <= 0) continue;
    const char state = launcher_.stateOf(w.pid);
    if ((state == 0 || state == 'Z') && !reap_rechecked_) {
      reaping = true;  // dead, its SIGCHLD not handled yet: the reaper is about to report it
      continue;
    }
    w.unreaped_as = inspectProcess(w.pid);
    if (w.unreaped_as.state == 0) w.unreaped_as.state = state;
    giveUp(w, waited);
  }
  if (reaping) {
    // Once: a process that is gone is reaped by the next turn of the loop.
    reap_rechecked_ = true;
    timers_->reap.expires_after(kReapRecheck);
    timers_->reap.async_wait(whileAlive(alive_, [this] {
      if (phase_ == Phase::kStopping) onReapTimeout();
    }));
    return;
  }
  if (allExited()) beginDrain();
}

void AttemptTeardown::giveUp(AttemptWorker& w, double seconds_after_kill) {
  w.unreaped = true;
  w.exited = true;
  w.exited_during_stop = true;
  w.exit_time = SystemClock::now();
  if (callbacks_.given_up) callbacks_.given_up(static_cast<size_t>(&w - workers_.data()));
  unreaped_ = true;
  nlohmann::json left = nlohmann::json::array();
  std::string left_text;
  for (pid_t pid : descendantsOf(w.pid)) {
    StuckProcess p = inspectProcess(pid);
    if (p.state == 0 || p.state == 'Z') continue;
    left.push_back(stuckToJson(p));
    left_text += "; " + describeStuck(p);
  }
  CPPRUN_LOG(kError) << "rank " << w.spec.rank << ": " << describeStuck(w.unreaped_as)
                     << " still alive " << formatWait(options_.reap_timeout)
                     << " after SIGKILL; giving up on it (exit 7)" << left_text;
  for (const std::string& frame : w.unreaped_as.stack) {
    CPPRUN_LOG(kError) << "  pid " << w.pid << " kernel stack: " << frame;
  }
  emitEvent(options_.event_log, "worker_unreaped",
            {{"attempt", attempt_},
             {"rank", w.spec.rank},
             {"local_rank", w.spec.local_rank},
             {"pid", w.pid},
             {"seconds_after_sigkill", seconds_after_kill},
             {"reap_timeout_s", options_.reap_timeout.count() / 1000.0},
             {"process", stuckToJson(w.unreaped_as)},
             {"group_left", left}});
  // Its pipes stay open as long as it lives: take what is there and stop reading.
  if (w.out) w.out->close();
  if (w.err) w.err->close();
}

void AttemptTeardown::signalWorkers(int signo) {
  for (const AttemptWorker& w : workers_) {
    if (w.pid <= 0) continue;
    if (Status s = launcher_.signalWorker(w.pid, !w.exited, signo); !s.isOk()) {
      CPPRUN_LOG(kWarn) << s.message();
    }
  }
}

void AttemptTeardown::onWorkerExited() {
  if (phase_ == Phase::kStopping && allExited()) beginDrain();
}

void AttemptTeardown::beginDrain() {
  phase_ = Phase::kDraining;
  if (callbacks_.draining) callbacks_.draining();
  // Every worker has exited: input read from now on waits for the next attempt's.
  if (options_.stdin_forwarder != nullptr) options_.stdin_forwarder->clearWorkers();
  timers_->stop.cancel();
  timers_->notice.cancel();
  timers_->reap.cancel();
  sent_kill_ = false;
  // Whatever is left in the workers' groups (grandchildren) and whatever double-forked out of
  // them and was re-parented to us goes now, so the pipes reach EOF.
  signalWorkers(SIGKILL);
  std::vector<pid_t> given_up;  // still the agent's children, not orphans
  for (const AttemptWorker& w : workers_) {
    if (w.unreaped) given_up.push_back(w.pid);
  }
  size_t orphans = launcher_.killAdoptedOrphans(given_up);
  if (orphans > 0) {
    CPPRUN_LOG(kInfo) << "killed " << orphans << " process(es) left behind by the workers";
  }
  timers_->drain.expires_after(options_.drain_timeout);
  timers_->drain.async_wait(whileAlive(alive_, [this] {
    if (phase_ != Phase::kDraining) return;
    CPPRUN_LOG(kWarn) << "worker output still open " << options_.drain_timeout.count()
                      << " ms after the workers exited; closing it";
    for (AttemptWorker& w : workers_) {
      if (w.out) w.out->close();
      if (w.err) w.err->close();
    }
  }));
  onOutputEof();
}

void AttemptTeardown::onOutputEof() {
  if (phase_ != Phase::kDraining) return;
  for (const AttemptWorker& w : workers_) {
    if ((w.out && !w.out->atEof()) || (w.err && !w.err->atEof())) return;
  }
  timers_->drain.cancel();
  phase_ = Phase::kIdle;
  if (callbacks_.drained) callbacks_.drained();
}

void AttemptTeardown::cancel() {
  phase_ = Phase::kIdle;
  timers_->stop.cancel();
  timers_->notice.cancel();
  timers_->reap.cancel();
  timers_->drain.cancel();
}

}  // namespace cpprun::agent
