// FileTimerServer: the agent's side of torch's FileTimer watchdog
// (torch.distributed.elastic.timer.FileTimerClient / FileTimerServer, file_based_local_timer.py),
// which torchrun serves when TORCHELASTIC_ENABLE_FILE_TIMER=1.
//
// A worker arms a countdown with `with expires(after=5, scope="step"):`; its FileTimerClient
// opens the named pipe in TORCHELASTIC_TIMER_FILE with O_WRONLY | O_NONBLOCK (ENXIO, and a
// BrokenPipeError in the worker, when nobody has it open for reading), writes one JSON line of
// at most PIPE_BUF bytes and closes it:
//
//   {"version": 1, "pid": 123, "scope_id": "step", "expiration_time": 1700000000.5,
//    "signal": 9}
//
// `expiration_time` is wall-clock epoch seconds (time.time() + after); a negative one releases
// the scope (the end of the `with` block, signal 0). Timers are keyed by (pid, scope_id); arming
// a key again replaces it. When a timer is due, the pid's first expired timer with a signal > 0
// (in expiration order) names the signal it is sent, and every timer of that pid is dropped;
// with no such signal the pid is not signalled (torch's rules).
//
// Unlike torch's server this one:
//   * refuses requests for a pid that is not one of this agent's workers or a descendant of
//     one (torch signals whatever pid a line names; pid 0 would be its own process group);
//   * drops a malformed or oversized line with a log line, and keeps the rest (torch's
//     exception loses the requests read with it);
//   * acts when a timer is due (a timer armed for the earliest expiry) instead of at 0.1 s polls;
//   * tells the caller (on_expired) instead of killing its own process: the supervisor fails the
//     attempt with the scope as the root cause.
//
// The pipe is opened O_RDONLY | O_NONBLOCK and read on the agent's io_context; the server also
// holds a write end, so the read end never sees EOF between clients (no spinning). Lines longer
// than kMaxFileTimerLineBytes are dropped whole. At most kMaxFileTimerLogs bad requests per
// attempt are logged one by one; the rest are counted.
//
// Thread safety: loop thread only; every method and every callback runs there.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

// The longest request line, without its newline: torch's FileTimerClient refuses to write a
// request longer than PIPE_BUF (4096 on Linux).
inline constexpr size_t kMaxFileTimerLineBytes = 4096;
// Bad requests logged one by one per attempt; later ones are counted only.
inline constexpr int kMaxFileTimerLogs = 10;

// What TORCHELASTIC_ENABLE_FILE_TIMER / TORCHELASTIC_TIMER_FILE ask of the agent.
struct FileTimerOptions {
  bool enabled = false;
  std::string path;  // the FIFO (REQUIRES: not empty when enabled)
};

// One request line, as FileTimerRequest.to_json() writes it.
struct FileTimerRequest {
  int64_t version = 1;
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // epoch seconds; negative: release
  int signal = 0;

  bool release() const { return expiration_time < 0; }
};

// Parses one line (without its newline). kInvalidArgument saying what is wrong when it is not a
// JSON object with an integer "pid" > 0, a string "scope_id", a number "expiration_time" and an
// integer "signal" in 0..64 ("version", when present, must be an integer; torch writes 1).
Result<FileTimerRequest> parseFileTimerRequest(std::string_view line);

// The armed timers and which ones are due: pure, no I/O, no clock (times are epoch seconds).
class FileTimerTable {
 public:
  struct Timer {
    FileTimerRequest request;
    size_t worker = 0;      // the worker the pid is or descends from
    double armed_at = 0.0;  // epoch seconds when the request arrived
  };
  // Every expired timer of one pid, oldest expiration first, and the one whose signal it gets
  // (the first with signal > 0; none: the pid is not signalled).
  struct Expired {
    pid_t pid = 0;
    size_t worker = 0;
    std::vector<Timer> timers;
    std::optional<Timer> reap;
  };

  // Arms (replacing the same pid and scope) or, for a release, disarms.
  void apply(const FileTimerRequest& request, size_t worker, double now);
  // The earliest expiration armed; nullopt when none.
  std::optional<double> earliest() const;
  // The pids with a timer expired at `now` (expiration_time <= now), in pid order; every timer
  // of those pids is removed.
  std::vector<Expired> takeExpired(double now);
  // Drops every timer of worker `worker` (it exited) or of `pid`.
  void dropWorker(size_t worker);
  void dropPid(pid_t pid);
  void clear() { timers_.clear(); }
  size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
};

// The index in `roots` of the process `pid` is, or descends from (parents read from /proc, at
// most 64 generations); nullopt when none. Entries <= 0 in `roots` are skipped.
std::optional<size_t> findOwner(pid_t pid, const std::vector<pid_t>& roots);

class FileTimerServer {
 public:
  struct Expiry {
    size_t worker = 0;
    pid_t pid = 0;
    std::string scope_id;
    int signal = 0;
    double armed_at = 0.0;  // epoch seconds
    double expiration_time = 0.0;
    double seen_at = 0.0;             // when the server acted on it
    std::string kill_error;           // empty: the signal was sent (or the pid had already gone)
    std::vector<std::string> scopes;  // every expired scope of the pid
  };
  struct Callbacks {
    // The worker `pid` is or descends from; nullopt refuses the request.
    std::function<std::optional<size_t>(pid_t)> owner;
    // A timer of a worker's pid expired and the pid was sent its signal (> 0).
    std::function<void(const Expiry&)> on_expired;
    // How a pid is signalled; empty: ::kill. (Tests.)
    std::function<int(pid_t, int)> kill;
    // The wall clock in epoch seconds; empty: the system clock. (Tests.)
    std::function<double()> now;
  };

  // REQUIRES: `io` outlives the server.
  FileTimerServer(boost::asio::io_context& io, std::string path, Callbacks callbacks);
  // Stops reading and removes the FIFO.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  // Makes the FIFO (mode 0600; an existing FIFO there is replaced, anything else is an error
  // naming the path) and starts reading it. Idempotent while open.
  Status open();
  // Stops reading and removes the FIFO (idempotent).
  void close();
  // A new attempt: timers are cleared and requests are accepted.
  void beginAttempt();
  // The attempt is over (teardown): timers are cleared; requests are read and ignored.
  void endAttempt();
  // Worker `worker` exited: its timers are dropped.
  void workerExited(size_t worker);

  const std::string& path() const;
  size_t armedTimers() const;
  uint64_t requestsTotal() const;  // well-formed request lines read, whatever became of them
  uint64_t refusedTotal() const;   // lines dropped: malformed, oversized or an unknown pid

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
