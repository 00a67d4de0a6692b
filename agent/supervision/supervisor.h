// Supervisor: runs one node's worker group through its attempts — start, watch, tear down,
// restart — as torchrun's agent does, but driven by events instead of a polling loop.
//
//            start()                 first failure / handled signal
//   kIdle ───────────▶ kRunning ───────────────────────────────────▶ kStopping
//                        │  all exited 0                               │ every worker exited
//                        ▼                                             ▼ (SIGKILL at the timeout)
//                     kDraining ◀──────────────────────────────────────┘
//                        │ group's leftovers killed, every pipe at EOF (or the drain bound)
//                        ▼
//     failure with restarts left: next attempt (kRunning) — otherwise kDone
//
// Teardown sends the signal (SIGTERM after a failure, the received signal when forwarding) to
// every worker's process group, then SIGKILL after `shutdown_timeout`. When every worker has
// exited, what is left in their groups and any orphan re-parented to the agent is SIGKILLed,
// and output pipes are drained before the attempt's result is decided, so the last lines of a
// failing rank are in the report.
//
// Stall detection (options.stall.timeout > 0) is the StallWatchdog's
// (agent/supervision/stall_watchdog.h): the supervisor gives every worker CPPRUN_PROGRESS_FILE and
// CPPRUN_STACK_FILE in its rank directory, tells the watchdog when workers start and exit, and runs
// its checks while the attempt runs. When the watchdog has collected the stacks of stalled ranks,
// the attempt fails with them as its root cause: the usual teardown, then a restart or the end.
// While a teardown waits for workers to exit, a notice says which ranks and for how long.
//
// torch's FileTimer watchdog (options.file_timer, agent/supervision/file_timer_server.h): the
// supervisor opens the pipe before the first attempt's workers start (a failure ends the job as a
// start failure), gives every worker TORCHELASTIC_TIMER_FILE, clears the timers at each attempt's
// start and teardown, and removes the pipe when the job ends. A timer that expires gets its pid
// the requested signal (the server's job) and fails the attempt with the expired scope as its
// root cause: the usual teardown, then a restart or the end. (torchrun also kills itself.)
//
// Uninterruptible sleep (options.uninterruptible_timeout > 0, torch's
// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT): while the attempt runs, a timer reads each running
// worker's /proc/PID/stat (stuck_process.h, uninterruptibleCheckInterval); a worker seen in
// state D on every check for the timeout fails the attempt as torch marks the group UNHEALTHY:
// the usual teardown and no restart (a wedged worker holds a GPU or NIC a new one would need).
//
// Reap bound (options.reap_timeout): a worker still not reaped that long after SIGKILL (a process
// in uninterruptible sleep does not die until the kernel lets it) is given up: it and whatever
// lives on in its process group are named (pid, state, wchan, kernel stack) in the log, the
// `worker_unreaped` event and the failure report, its output is closed, and the job ends with
// JobOutcome::kUnreaped (exit 7) instead of waiting for it; no restart follows.
//
// Thread safety: loop thread only; every entry point (start, onChildExit, onSignal) and every
// callback runs there.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/console/worker_output.h"
#include "agent/coordination/job_coordinator.h"
#include "agent/observability/event_log.h"
#include "agent/processes/process_launcher.h"
#include "agent/supervision/failure_report.h"
#include "agent/supervision/file_timer_server.h"
#include "agent/supervision/restart_policy.h"
#include "agent/supervision/stall_watchdog.h"
#include "agent/supervision/worker_spec.h"
#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

// An attempt's workers and the directory for their log files (empty: none).
struct AttemptSpec {
  std::vector<WorkerSpec> workers;
  std::string attempt_dir;  // <log dir>/<run id>/attempt_<n>; per-rank dirs are made under it
};

struct JobOutcome;
class StdinForwarder;

struct SupervisorOptions {
  int max_restarts = 0;
  std::chrono::milliseconds shutdown_timeout{30000};
  // After SIGKILL: how long teardown waits for a worker to be reaped before it reports it as
  // unkillable and ends the job (exit 7) without it (--reap-timeout).
  std::chrono::milliseconds reap_timeout{5000};
  // A running worker in uninterruptible sleep (D) this long fails the attempt without a restart
  // (--uninterruptible-state-timeout, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT). 0: off.
  std::chrono::milliseconds uninterruptible_timeout{0};
  // After every worker of an attempt has exited and its leftovers are killed: how long to
  // wait for the pipes to reach EOF before giving up on the rest of the output.
  std::chrono::milliseconds drain_timeout{2000};
  OutputOptions output;
  // Multi-node jobs: the other agents (null on one node). Attempts start when every node is
  // ready, the first failure anywhere stops every node's workers, and the coordinator's
  // decision (one restart budget for the job) replaces max_restarts. Must outlive the
  // supervisor.
  JobCoordinator* coordinator = nullptr;
  StallOptions stall;
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: serve torch's FileTimerClient on file_timer.path.
  FileTimerOptions file_timer;
  // Read progress files even without stall detection (for /status and /metrics).
  bool track_progress = false;
  // --warm-restart: Python workers get cpprun's sitecustomize (its import record) even without
  // stall detection (agent/processes/warm_start_launcher.h starts them).
  bool warm_restart = false;
  EventLog* event_log = nullptr;  // may be null; must outlive the supervisor
  // Where the workers' console lines and log files are written (threads of their own, so a
  // stalled console never blocks the loop). Null: the supervisor makes its own for
  // output.console_stdout_fd / console_stderr_fd.
  std::shared_ptr<OutputSinks> sinks;
  // cpprun's stdin for the workers that read it (stdin_forwarder.h); null: every worker reads
  // /dev/null. Must outlive the supervisor.
  StdinForwarder* stdin_forwarder = nullptr;
  // Run on the job's outcome before it is logged and handed on: the agent's last word on it
  // (a node that left the job: health_gate.h). Empty: none.
  std::function<void(JobOutcome&)> amend_outcome;
  // One node: a step before every attempt, the first and each restart (the health check:
  // HealthGate::checkBeforeAttempt). Once it calls `go` (on the loop), the attempt is prepared
  // (PrepareAttempt), which fails it — the job ends before any worker starts, as a start
  // failure that amend_outcome may name — when the step failed. Empty: none. Multi-node jobs
  // have the coordinator's beginAttempt instead.
  std::function<void(int restart_count, std::function<void()> go)> before_attempt;
};

// What the supervisor is doing now, for /status and /metrics (loop thread).
struct WorkerSnapshot {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool alive = false;
  int exit_code = 0;                  // when exited
  int signal = 0;                     // when killed by a signal
  std::optional<uint64_t> progress;   // the last counter the worker reported
  double seconds_since_progress = 0;  // since its last report, or its start
  bool stalled = false;
  uint64_t stdout_bytes = 0;
  uint64_t stderr_bytes = 0;
  std::string numa_binding;  // WorkerSpec::binding (empty: --numa-binding off)
};

// The job's last hang verdict (stall_verdict.h) as this node learnt it: its own (one node) or
// the decider's (multi-node). attempt -1: none yet.
struct HangVerdictSnapshot {
  int attempt = -1;
  std::string summary;        // "hang: rank 3 (node 1, b) did not enter all_reduce #5: ..."
  std::vector<int> culprits;  // ranks; empty: every rank waited in the same collective
  std::vector<int> waiting;   // ranks
  uint64_t verdicts_total = 0;
  uint64_t culprits_total = 0;  // ranks named culprits, every verdict
};

struct SupervisorSnapshot {
  std::string state;  // waiting, running, stopping, draining, done
  int restart_count = 0;
  std::vector<WorkerSnapshot> workers;
  // Seconds spent in each state since the supervisor was created, the current one included.
  std::map<std::string, double> seconds_in_state;
  uint64_t output_bytes_total = 0;  // every attempt's workers, stdout and stderr
  uint64_t workers_started_total = 0;
  uint64_t worker_failures_total = 0;  // exits that were not 0, teardown excluded
  uint64_t stalls_total = 0;
  HangVerdictSnapshot last_hang;
  // Worker lines not shown because the console did not keep up (the log files have them), and
  // the agent's own log lines dropped for the same reason.
  uint64_t console_lines_dropped_total = 0;
  uint64_t log_lines_dropped_total = 0;
};

struct JobOutcome {
  // kLeft: this node left the elastic job on request (drain; the others go on), exit 0.
  // kNotNeeded: this node waited as a spare and the job ended without it, exit 0.
  // kUnhealthy, kExcluded: this node left the job (health_gate.h) and the others go on.
  enum class Kind {
    kSucceeded,
    kWorkersFailed,
    kSignalled,
    kStartFailed,
    kLostPeers,
    kLeft,
    kNotNeeded,
    kUnhealthy,
    kExcluded,
    kUnreaped
  };
  Kind kind = Kind::kSucceeded;
  int restarts = 0;  // attempts restarted
  int signal = 0;    // kSignalled: the signal received
  Status error;      // kStartFailed, kLostPeers: why
  // The last failed attempt's: this node's in local-rank order, or (multi-node) every node's.
  std::vector<WorkerFailure> failures;
  std::string summary;  // multi-node: who stopped the job first, or why it ended
  // Multi-node: the nodes that left the job while this one was in it (excluded), one line each.
  std::vector<std::string> departures;
  // 0 succeeded (or left, or not needed), 1 workers failed, 128+N signalled, 3 could not start, 4
  // lost the other nodes, 5 this node failed its health check and left, 6 this node was excluded,
  // 7 a worker (or a process of its group) was still alive the reap bound after SIGKILL, whatever
  // else happened (docs/supervision.md).
  int exitCode() const;
};

// How the event log spells a job's outcome: "succeeded", "workers_failed", "signalled",
// "start_failed", "lost_peers", "left", "not_needed", "unhealthy", "excluded", "unreaped".
const char* jobOutcomeName(JobOutcome::Kind kind);

class Supervisor {
 public:
  // Makes the workers of attempt `restart_count` (0, 1, ...): the place to refresh the NCCL
  // id, clear the store and create log directories. An error ends the job (kStartFailed).
  using PrepareAttempt = std::function<Result<AttemptSpec>(int restart_count)>;
  using OnDone = std::function<void(const JobOutcome&)>;

  // REQUIRES: `io` and `launcher` outlive the supervisor.
  Supervisor(boost::asio::io_context& io, ProcessLauncher& launcher, SupervisorOptions options,
             PrepareAttempt prepare, OnDone on_done);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  void start();
  // A child exited (from ChildReaper). Unknown pids (adopted orphans) are ignored.
  void onChildExit(pid_t pid, int wait_status);
  // A handled signal reached the agent: forward it to every group, then tear down. No restart
  // follows.
  void onSignal(int signo);
  // SIGWINCH: cpprun's terminal changed size; every worker pty gets the new size.
  void onWindowChange();
  // Multi-node: another node's failure (or a lost agent) stopped attempt `restart_count`; the
  // workers get SIGTERM. When that node received a handled signal (`signal` != 0), the workers
  // get that signal instead, as that node's did (a SIGUSR1 pre-emption warning reaches every
  // rank, not only the ranks of the node Slurm happened to signal first). `stall`: that node's
  // ranks stalled; with stall detection on, a snapshot of every rank (stall_watchdog.h) is taken
  // first (within --stall-stacks-timeout) for the job's verdict on who caused the hang.
  void onPeerStop(int restart_count, const std::string& reason, int signal = 0, bool stall = false);
  // Multi-node, elastic: the coordinator claimed the running attempt's stop for this node's
  // leave (drain, JobCoordinator::requestLeave): the workers get SIGTERM (then SIGKILL after
  // shutdown_timeout), this node reports and reads the job's decision like the others, and
  // ends with JobOutcome::kLeft instead of joining the next round. `why` names the request.
  void onLeave(const std::string& why);
  // Multi-node: the job's store cannot be reached; the workers are stopped and the job ends.
  void onCoordinatorLost(const Status& status);
  // Multi-node: what the nodes agreed for the attempt being prepared (membership, NCCL id);
  // set before PrepareAttempt runs. nullopt on one node.
  const std::optional<AttemptStart>& attemptStart() const;

  bool done() const;
  int restartCount() const;
  // Pids of the current attempt's workers still running (for tests and the signal path).
  std::vector<pid_t> runningPids() const;
  SupervisorSnapshot snapshot() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
