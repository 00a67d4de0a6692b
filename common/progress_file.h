// The progress file: how a worker tells its agent "I am still making progress", cheaply.
//
// The agent gives every worker CPPRUN_PROGRESS_FILE, a path in that rank's log directory. A
// worker bumps it once per step (or per any unit of work); with --stall-timeout the agent
// declares a rank stalled when its file has not changed for that long while the process is
// alive. The format is one decimal counter, written in place: 20 digits and a newline at
// offset 0, so a bump is one pwrite(2) of 21 bytes on a descriptor opened once (about a
// microsecond). Any change of the file's modification time counts as progress, so a shell
// script's `touch "$CPPRUN_PROGRESS_FILE"` works too; the counter is what /status shows.
//
// Thread safety: ProgressReporter is used by one thread at a time (bump() is not atomic across
// threads); readProgress is a free function, safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cpprun {

inline constexpr const char* kProgressFileVariable = "CPPRUN_PROGRESS_FILE";

// Worker side. Does nothing (and costs nothing) when the variable is unset or the file cannot
// be opened: progress reporting never breaks training.
class ProgressReporter {
 public:
  // Opens the file named by CPPRUN_PROGRESS_FILE, if set.
  static ProgressReporter fromEnvironment();
  // Opens `path` (created if missing); an empty path makes a reporter that does nothing.
  explicit ProgressReporter(const std::string& path);
  ~ProgressReporter();
  ProgressReporter(ProgressReporter&& other) noexcept;
  ProgressReporter& operator=(ProgressReporter&& other) noexcept;
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  bool active() const { return fd_ >= 0; }
  // Writes `counter` (e.g. the global step).
  void bump(uint64_t counter);

 private:
  int fd_ = -1;
};

// Agent side: what the file says now.
struct ProgressSample {
  int64_t mtime_ns = 0;             // modification time, nanoseconds since the epoch
  std::optional<uint64_t> counter;  // the counter, when the file holds one
};

// nullopt when the file does not exist (the worker has not reported yet).
std::optional<ProgressSample> readProgress(const std::string& path);

}  // namespace cpprun
