// Processes the kernel will not let go: a worker in uninterruptible sleep (Linux "D" state) while
// the job runs, and a process that SIGKILL has not ended within the teardown's reap bound. Both
// come from /proc: the state letter in /proc/PID/stat, the kernel wait channel in
// /proc/PID/wchan and, where readable (root), the kernel stack in /proc/PID/stack.
//
// updateDwell is torch 2.15's bookkeeping for TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT
// (local_elastic_agent.py, _update_uninterruptible_dwell): a worker seen in D is timed from the
// first check that saw it there; any other state (or an unreadable one) clears the clock.
//
// Thread safety: free functions; inspectProcess reads /proc and may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::agent {

// What /proc says about one process. state 0: the process is gone (or /proc unreadable).
struct StuckProcess {
  pid_t pid = 0;
  char state = 0;
  std::string comm;                // /proc/PID/comm, without the newline
  std::string wchan;               // /proc/PID/wchan; "" when unreadable or "0" (running)
  std::vector<std::string> stack;  // /proc/PID/stack without "[<0>] ", empty when unreadable
};

StuckProcess inspectProcess(pid_t pid);

// "pid 123 (python3) state D (uninterruptible sleep), wchan hrtimer_nanosleep"
std::string describeStuck(const StuckProcess& p);
// {"pid", "comm", "state", "wchan", "stack"} (stack left out when empty).
nlohmann::json stuckToJson(const StuckProcess& p);
// "uninterruptible sleep" for 'D', "zombie" for 'Z', ... ("" for letters it does not know).
const char* stateWord(char state);

// torch's dwell rule. `since` is the time the process was first seen in D (nullopt: not in D).
// Returns how long it has been in D now, or nullopt when `state` is not 'D' (and clears since).
std::optional<std::chrono::milliseconds> updateDwell(
    std::optional<std::chrono::steady_clock::time_point>& since, char state,
    std::chrono::steady_clock::time_point now);

// How often the running workers' states are read for `timeout`: a quarter of it, at least
// 100 ms and at most 1 s (torch reads them every --monitor-interval, 0.1 s by default; a quarter
// keeps the detection within 25% of the timeout at a fraction of the reads).
std::chrono::milliseconds uninterruptibleCheckInterval(std::chrono::milliseconds timeout);

}  // namespace cpprun::agent
