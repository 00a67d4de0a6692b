// StallWatchdog: watches one attempt's workers for progress and, when a rank stops making any,
// collects its stacks and tells the supervisor. The supervisor owns the attempt (spawning,
// teardown, restarts); the watchdog owns everything about progress and stalls.
//
// Progress: every worker with a rank directory gets CPPRUN_PROGRESS_FILE (common/progress_file.h)
// and CPPRUN_STACK_FILE there (progressFile/stackFile give the paths). A changed file is progress
// (the trainer's own reports, or the automatic stamps of agent/supervision/python_progress.h).
// While checks run (startChecks .. stopChecks) the files are read every check interval. Two bounds,
// as NVIDIA's ft_launcher has: a running worker that has not reported since its start for
// `first_timeout` (imports, CUDA/NCCL set-up, the rendezvous, loading data), or whose file has
// not changed since its last report for `timeout`, is stalled.
//
// A snapshot of every rank, per stall (every rank found stalled by one check together) or when
// a peer's stall stopped the attempt (collectForPeer), all of it bounded by `stacks_timeout`
// from the stall (0: no stacks, on_collected at once). Every rank is looked at, not only the
// stalled ones: the culprit of a hang is often one that is not stalled or not stalled first
// (agent/supervision/stall_verdict.h).
//
//   check finds ranks stalled ──▶ SIGUSR1 to every running rank whose faulthandler helper
//        │                        created its stack file (Python stacks), then on_stalled
//        ▼ faulthandler_grace (0 when no rank got SIGUSR1; at most half the bound)
//   gdb -batch "thread apply all bt" per stalled rank still running that has no Python stacks
//        │ (native stacks; gdb does not finish within the bound on a torch process), each
//        │ writing <rank dir>/stacks_gdb.txt; all SIGKILLed (and their ranks sent SIGCONT, so
//        │ none stays stopped by ptrace) when the bound is reached
//        ▼ every gdb exited (or none was started)
//   excerpts of the stalled ranks built from both files and logged; every rank's RankState
//   (its collective record, innermost Python frame, stack) ──▶ on_collected (the supervisor
//   decides the verdict and fails the attempt), then collectForPeer's callbacks
//
// While stacks are collected no new stall is declared. A new attempt (beginAttempt) abandons a
// collection in progress: gdbs of an older stall that exit later are consumed and ignored.
//
// Timers and helpers run on the agent's io_context; the watchdog has no threads of its own.
// Callbacks are invoked from the watchdog's timer handlers or from onChildExit, never from
// inside a call the supervisor makes to start or stop checks.
//
// Thread safety: loop thread only; every method and every callback runs there.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/observability/event_log.h"
#include "agent/processes/process_launcher.h"
#include "agent/supervision/stall_verdict.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

struct StallOptions {
  // Between two progress reports of a worker; 0: stall detection off.
  std::chrono::milliseconds timeout{0};
  // From a worker's start to its first report; 0: the same as `timeout`.
  std::chrono::milliseconds first_timeout{0};
  // How often progress files are read; 0: a tenth of the timeout, between 10 and 250 ms (1 s
  // when only /status reads progress).
  std::chrono::milliseconds check_interval{0};
  std::string gdb_path;  // empty: no native stacks
  // The whole stack collection of a stall, from its detection; 0: no stacks at all.
  std::chrono::milliseconds stacks_timeout{std::chrono::seconds(1)};
  // Between SIGUSR1 (faulthandler) and attaching gdb, so the Python stacks are written first.
  std::chrono::milliseconds faulthandler_grace{std::chrono::milliseconds(250)};
  // Python workers stamp progress by themselves (agent/supervision/python_progress.h; the
  // supervisor acts on it, with stall detection on).
  bool python_progress = true;
};

// What the watchdog knows about one worker of the current attempt.
struct WorkerProgress {
  bool started = false;                                 // workerStarted was called for it
  bool reported = false;                                // it has reported since its start
  std::chrono::steady_clock::time_point last_progress;  // its last report, or its start
  std::optional<uint64_t> progress;                     // the last counter it reported
  bool stalled = false;
  std::chrono::system_clock::time_point stall_time;
  std::string stall_message;               // "stalled: no progress for ..." (when stalled)
  std::vector<std::string> stack_excerpt;  // filled when its stacks are collected
};

class StallWatchdog {
 public:
  struct Callbacks {
    // Ranks (worker indices) found stalled; their stacks are being collected. May be null.
    std::function<void(const std::vector<size_t>& indices)> on_stalled;
    // The stall's stack collection is over; worker(i).stack_excerpt holds what was found.
    std::function<void(const std::vector<size_t>& indices)> on_collected;
  };

  // A worker to watch: its identity and where its files are (empty rank_dir: no files).
  struct Worker {
    int rank = 0;
    int local_rank = 0;
    pid_t pid = -1;
    std::string rank_dir;
  };

  // `track_progress`: read progress files even when stall detection is off (for /status).
  // REQUIRES: `io`, `launcher` and `event_log` (may be null) outlive the watchdog.
  StallWatchdog(boost::asio::io_context& io, ProcessLauncher& launcher, StallOptions options,
                bool track_progress, EventLog* event_log, Callbacks callbacks);
  ~StallWatchdog();
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  // The files a worker with rank directory `rank_dir` is given.
  static std::string progressFile(const std::string& rank_dir);
  static std::string stackFile(const std::string& rank_dir);
  // The worker's collective record (stall_verdict.h; CPPRUN_COLLECTIVE_FILE).
  static std::string collectiveFile(const std::string& rank_dir);

  // A new attempt `attempt` (for events) with `worker_count` workers: forgets the last one's
  // workers and abandons its stack collection. Checks stay stopped until startChecks.
  void beginAttempt(int attempt, size_t worker_count);
  // Worker `index` was spawned now: its stall clock starts. REQUIRES: index < worker_count.
  void workerStarted(size_t index, const Worker& worker);
  // Worker `index` exited: it is no longer read, declared stalled or given to gdb.
  void workerExited(size_t index);
  // Starts the periodic reads (when stall detection or progress tracking is on).
  void startChecks();
  // Stops them (the attempt is being torn down); a stack collection in progress goes on.
  void stopChecks();
  // Reads every running worker's progress file now (a fresh answer for /status).
  void refresh();
  // A child exited: true when it was one of the watchdog's helpers (gdb), which it consumes.
  bool onChildExit(pid_t pid, int wait_status);

  // A peer's stall stopped the attempt: takes a snapshot of every rank (as for a stall of this
  // node's own, without declaring any stalled), then calls `done` on the loop; joins one in
  // progress; calls it at once with stall detection off. beginAttempt calls pending ones.
  void collectForPeer(std::function<void()> done);
  // Every started rank's state from the attempt's last snapshot, in worker order (exit codes
  // are the supervisor's to fill in); empty when none was taken.
  const std::vector<RankState>& rankStates() const;

  const WorkerProgress& worker(size_t index) const;
  uint64_t stallsTotal() const;
  bool stallDetectionOn() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
