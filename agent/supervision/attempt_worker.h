// AttemptWorker: one worker of the supervisor's current attempt, as the supervisor and its parts
// (worker_wiring.h, attempt_teardown.h, uninterruptible_check.h, attempt_failures.h) share it:
// its spec, its process, how and when it ended, why the agent failed it, and its output readers.
// A plain record; the supervisor owns the attempt's vector of them and the parts read and update
// the entries their job is about.
//
// Thread safety: loop thread only, as the supervisor that owns it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/console/worker_output.h"
#include "agent/supervision/stall_watchdog.h"
#include "agent/supervision/stuck_process.h"
#include "agent/supervision/supervisor.h"
#include "agent/supervision/worker_spec.h"

namespace cpprun::agent {

struct AttemptWorker {
  WorkerSpec spec;
  pid_t pid = -1;  // -1: not started
  bool exited = false;
  int status = 0;  // the wait status, once exited
  std::chrono::system_clock::time_point exit_time;
  bool exited_during_stop = false;
  // A FileTimer scope of this worker expired (its root cause): what and when.
  std::optional<std::pair<std::string, std::chrono::system_clock::time_point>> timer_expiry;
  // Uninterruptible sleep: since when every check saw it in D (torch's dwell), and whether
  // that lasted the timeout (then the failure's message and time say so).
  std::optional<std::chrono::steady_clock::time_point> d_since;
  bool d_timed_out = false;
  std::string d_message;
  std::vector<std::string> d_stack;  // its kernel stack then, where readable
  std::chrono::system_clock::time_point d_time;
  // Still alive the reap bound after SIGKILL: given up on (exited is set too) and described.
  bool unreaped = false;
  StuckProcess unreaped_as;
  std::unique_ptr<WorkerOutput> out;
  std::unique_ptr<WorkerOutput> err;

  // Bytes read from its stdout and stderr so far.
  uint64_t outputBytes() const {
    return (out ? out->bytesRead() : 0) + (err ? err->bytesRead() : 0);
  }
};

// Whether a wait status is an exit with 0.
bool exitedCleanly(int wait_status);
// "exited with code 3", "was killed by SIGKILL".
std::string describeWaitStatus(int wait_status);
// What /status and /metrics show of `w`, whose progress the watchdog reports as `progress`.
WorkerSnapshot snapshotOf(const AttemptWorker& w, const WorkerProgress& progress,
                          std::chrono::steady_clock::time_point now);
// "0, 2, 5": the ranks of `workers` still running (not exited).
std::string runningRanks(const std::vector<AttemptWorker>& workers);

}  // namespace cpprun::agent
