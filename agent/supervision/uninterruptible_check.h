// UninterruptibleCheck: torch's TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT
// (--uninterruptible-state-timeout) for the supervisor's running attempt. While the attempt runs,
// a timer reads each running worker's state (/proc/PID/stat through the launcher, every
// uninterruptibleCheckInterval); a worker seen in state D on every check for the timeout is
// described on its AttemptWorker (d_timed_out, d_message, d_stack, d_time), logged with a
// `worker_uninterruptible_timeout` event, and reported to the supervisor, which fails the attempt
// without a restart (a wedged worker holds a GPU or NIC a new group would need).
//
// Thread safety: loop thread only (the supervisor's Asio event loop); the callback runs there.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/observability/event_log.h"
#include "agent/processes/process_launcher.h"
#include "agent/supervision/attempt_worker.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

class UninterruptibleCheck {
 public:
  // `ranks`: the timed-out workers' ranks, "1, 3".
  using OnTimeout = std::function<void(const std::string& ranks)>;

  // `timeout` <= 0: off (start does nothing). REQUIRES: `io`, `launcher`, `workers` and
  // `event_log` (may be null) outlive the check.
  UninterruptibleCheck(boost::asio::io_context& io, ProcessLauncher& launcher,
                       std::vector<AttemptWorker>& workers, std::chrono::milliseconds timeout,
                       EventLog* event_log, OnTimeout on_timeout);
  ~UninterruptibleCheck();
  UninterruptibleCheck(const UninterruptibleCheck&) = delete;
  UninterruptibleCheck& operator=(const UninterruptibleCheck&) = delete;

  // The attempt `attempt` runs: check its workers until stop() or a timeout.
  void start(int attempt);
  // The attempt is being torn down: no more checks.
  void stop();

 private:
  void arm();
  // Returns true when a worker timed out (on_timeout was called).
  bool check();

  struct Timer;  // Asio's, in the .cc
  ProcessLauncher& launcher_;
  std::vector<AttemptWorker>& workers_;
  std::chrono::milliseconds timeout_;
  EventLog* event_log_;
  OnTimeout on_timeout_;
  std::unique_ptr<Timer> timer_;
  bool running_ = false;
  int attempt_ = 0;
  // Timer completions already queued when the check is destroyed must not reach it.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace cpprun::agent
