// AttemptTeardown: the end of one attempt's workers — the stop (the signal to every worker's
// process group, SIGKILL after the shutdown timeout, the reap bound after SIGKILL) and the drain
// (every worker exited: the groups' leftovers and adopted orphans SIGKILLed, the output pipes
// read to EOF within the drain bound). The supervisor (supervisor.h) owns one for the job, starts
// it on an attempt's first failure or handled signal (beginStop) or when every worker exited
// (beginDrain), and hears back when the attempt's output is complete (Callbacks::drained).
//
//           beginStop(signo)                   every worker exited (or given up on)
//   kIdle ───────────────────▶ kStopping ───────────────────────────────────────────▶ kDraining
//     ▲   ─────────────────────────────────────────beginDrain()─────────────────────────▶ │
//     └──────────────────── every pipe at EOF, or the drain bound: drained() ─────────────┘
//
// While stopping: a notice names the ranks still running (bounded by WaitNotice); at
// shutdown_timeout SIGKILL follows; a worker still alive reap_timeout after SIGKILL is given up on:
// named (pid, state, wchan, kernel stack, what lives on below it) in the log and the
// `worker_unreaped` event, its output closed, and marked exited and unreaped, so the job ends
// with exit 7 (anyUnreaped) instead of waiting for it.
//
// Thread safety: loop thread only (the supervisor's Asio event loop); every method and callback
// runs there.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "agent/observability/event_log.h"
#include "agent/processes/process_launcher.h"
#include "agent/supervision/attempt_worker.h"
#include "common/wait_notice.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

class StdinForwarder;

class AttemptTeardown {
 public:
  struct Options {
    std::chrono::milliseconds shutdown_timeout{30000};
    std::chrono::milliseconds reap_timeout{5000};
    std::chrono::milliseconds drain_timeout{2000};
    EventLog* event_log = nullptr;              // may be null
    StdinForwarder* stdin_forwarder = nullptr;  // may be null
  };
  struct Callbacks {
    std::function<void()> draining;              // every worker exited: the drain begins
    std::function<void()> drained;               // the attempt's output is complete
    std::function<void(size_t index)> given_up;  // a worker was given up on at the reap bound
  };

  // REQUIRES: `io`, `launcher` and `workers` outlive the teardown. `workers` is the current
  // attempt's (the supervisor replaces its contents between attempts, never while this stops).
  AttemptTeardown(boost::asio::io_context& io, ProcessLauncher& launcher,
                  std::vector<AttemptWorker>& workers, Options options, Callbacks callbacks);
  ~AttemptTeardown();
  AttemptTeardown(const AttemptTeardown&) = delete;
  AttemptTeardown& operator=(const AttemptTeardown&) = delete;

  // A new attempt runs: the last one's stop signal is forgotten.
  void beginAttempt() { stop_signal_ = 0; }
  // Sends `signo` to every worker (SIGCONT after SIGTERM: a stopped worker must wake to act on
  // it), then waits for them as above. `attempt` names the attempt in the events.
  // REQUIRES: not stopping or draining.
  void beginStop(int signo, int attempt);
  // Every worker has exited: kill what is left and read the pipes to EOF.
  void beginDrain();
  // A worker exited while stopping: the drain begins once every one has.
  void onWorkerExited();
  // A worker's pipe reached EOF: the attempt's output may be complete.
  void onOutputEof();
  // The job ends: every timer stops, no callback follows.
  void cancel();
  // Sends `signo` to every started worker (and its group while it runs).
  void signalWorkers(int signo);

  bool stopping() const { return phase_ == Phase::kStopping; }
  // The signal the last stop sent first (SIGTERM, a forwarded signal, SIGKILL); 0: none yet.
  int stopSignal() const { return stop_signal_; }
  // A worker of this job was given up on at the reap bound (exit 7; no restart).
  bool anyUnreaped() const { return unreaped_; }

 private:
  enum class Phase { kIdle, kStopping, kDraining };

  bool allExited() const;
  void armStopNotice();
  void announceStopWait(WaitNotice::Clock::time_point now);
  void onStopTimeout();
  void armReapTimer();
  void onReapTimeout();
  void giveUp(AttemptWorker& w, double seconds_after_kill);

  ProcessLauncher& launcher_;
  std::vector<AttemptWorker>& workers_;
  Options options_;
  Callbacks callbacks_;
  struct Timers;  // Asio's, in the .cc
  std::unique_ptr<Timers> timers_;
  Phase phase_ = Phase::kIdle;
  int attempt_ = 0;
  int stop_signal_ = 0;
  WaitNotice::Clock::time_point stop_began_;
  WaitNotice stop_notice_{WaitNotice::Clock::now()};
  bool sent_kill_ = false;
  WaitNotice::Clock::time_point kill_sent_at_;
  bool reap_rechecked_ = false;
  bool unreaped_ = false;
  // Timer completions already queued when the teardown is destroyed must not reach it.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace cpprun::agent
