// Attempt failures: what the supervisor reports of an attempt once it is over — one
// WorkerFailure per worker that did not exit 0 (a stall, an expired FileTimer scope or an
// uninterruptible sleep the agent ended it for taking the place of its exit as the failure; a
// worker given up on at the reap bound named with its state and wait channel), the node's report
// to the job (multi-node) and the job's outcome for an attempt's end (restart_policy.h), and the
// events that carry them into the event log (`failure`, `file_timer_expired`, `root_cause`,
// `job_finished`). The failure report's text is failure_report.h's.
//
// Thread safety: free functions; collectFailures reads the workers and the watchdog of the
// supervisor's loop and runs there; the others are pure or write only the (thread-safe) log.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/observability/event_log.h"
#include "agent/supervision/attempt_worker.h"
#include "agent/supervision/failure_report.h"
#include "agent/supervision/file_timer_server.h"
#include "agent/supervision/stall_watchdog.h"
#include "agent/supervision/supervisor.h"

namespace cpprun::agent {

// The failures of an attempt's `workers` in their order. `stop_signal`: the signal the
// teardown sent first (an exit by it, or by SIGKILL, during the stop is teardown, not a
// failure). `reap_timeout`: the bound a worker given up on outlived.
std::vector<WorkerFailure> collectFailures(const std::vector<AttemptWorker>& workers,
                                           const StallWatchdog& watchdog, int stop_signal,
                                           std::chrono::milliseconds reap_timeout);

// Every rank's state from the attempt's stall snapshot (stall_watchdog.h), with the exit code
// of each rank that had exited by then; empty when no snapshot was taken.
std::vector<RankState> attemptRankStates(const std::vector<AttemptWorker>& workers,
                                         const StallWatchdog& watchdog);

// One node: the hang's verdict over `states` (stall_verdict.h) applied to `failures`, logged and
// emitted as `stall_verdict` for attempt `attempt` (`log` may be null). Returns its summary
// ("hang: ..."), or "" when there is no verdict (no states, no rank in a collective).
std::string applyNodeStallVerdict(const std::vector<RankState>& states,
                                  std::vector<WorkerFailure>& failures, int attempt, EventLog* log);

// The job's failures as the decision lists them (at most kMaxDecisionFailures at scale), then
// this node's own failures the decision left out (by rank).
std::vector<WorkerFailure> mergedFailures(std::vector<WorkerFailure> job,
                                          std::vector<WorkerFailure> own);

// Records in `hang` a verdict that ended attempt `attempt`: `summary` ("hang: ...", else nothing
// is recorded) and the culprits and waiting ranks as `failures` say (applyStallVerdict's marks).
void noteHangVerdict(HangVerdictSnapshot& hang, int attempt, const std::string& summary,
                     const std::vector<WorkerFailure>& failures);

// A FileTimer scope of `w` expired (the server sent its pid the signal): records it as the
// worker's failure (w.timer_expiry: "FileTimer scope 'train_step' expired 60.0 s after it was
// armed; cpprun sent SIGKILL to pid 42", and what else expired with it), logs it and emits
// `file_timer_expired` for attempt `attempt` (`log` may be null).
void recordTimerExpiry(AttemptWorker& w, const FileTimerServer::Expiry& e, int attempt,
                       EventLog* log);

// Multi-node: what this node tells the job of an attempt that ended as `end` (never kLostPeers:
// a node that lost the job's store cannot tell it). `start_error`: kStartFailed's; `signal`:
// kSignalled's.
AttemptReport nodeReport(AttemptEnd end, std::vector<WorkerFailure> failures,
                         const Status& start_error, int signal);

// The job's outcome for its last attempt's `end` (kind, error, signal; the caller adds the rest).
// kStoppedByPeer is a success: the job's decision said how it ended.
JobOutcome jobOutcome(AttemptEnd end, const Status& lost_error, const Status& start_error,
                      int signal);

// A failure's fields as the `failure` and `root_cause` events carry them.
nlohmann::json failureEvent(const WorkerFailure& f);

// The job's last events: `root_cause` (when the job failed with failures) and `job_finished`.
// `log` may be null (nothing is written).
void emitJobEvents(EventLog* log, const JobOutcome& outcome);

}  // namespace cpprun::agent
