#include "agent/supervision/attempt_failures.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/logging.h"
#include "common/wait_notice.h"

namespace cpprun::agent {

namespace {

std::string kernelStackText(pid_t pid, const std::vector<std::string>& stack) {
  if (stack.empty()) return "";
  std::string text = "kernel stack (/proc/" + std::to_string(pid) + "/stack):\n";
  for (const std::string& frame : stack) text += "  " + frame + "\n";
  return text;
}

std::string errorFileOf(const AttemptWorker& w) {
  auto it = w.spec.env.find("TORCHELASTIC_ERROR_FILE");
  return it == w.spec.env.end() ? "" : it->second;
}

WorkerFailure unreapedFailure(const AttemptWorker& w, std::chrono::milliseconds reap_timeout) {
  WorkerFailure f;
  f.local_rank = w.spec.local_rank;
  f.rank = w.spec.rank;
  f.pid = w.pid;
  f.unreaped = true;
  f.state = w.unreaped_as.state;
  f.wchan = w.unreaped_as.wchan;
  f.teardown = !w.d_timed_out;
  f.time = w.d_timed_out ? w.d_time : w.exit_time;
  f.stderr_tail = w.err ? w.err->tail() : std::vector<std::string>{};
  f.error_file = errorFileOf(w);
  f.message = describeStuck(w.unreaped_as) + ": still alive " + formatWait(reap_timeout) +
              " after SIGKILL (--reap-timeout); cpprun gave up on it";
  if (w.d_timed_out) f.message = w.d_message + "\n" + f.message;
  f.traceback = f.message + "\n" + kernelStackText(w.pid, w.unreaped_as.stack);
  return f;
}

// The failure of a worker that exited (not 0) and was not given up on.
WorkerFailure exitFailure(const AttemptWorker& w, const WorkerProgress& progress, int stop_signal) {
  const bool stopped_by_us = w.exited_during_stop && WIFSIGNALED(w.status) &&
                             (WTERMSIG(w.status) == stop_signal || WTERMSIG(w.status) == SIGKILL);
  WorkerFailure f =
      describeFailure(w.spec.local_rank, w.spec.rank, w.pid, w.status, w.exit_time, errorFileOf(w),
                      w.err ? w.err->tail() : std::vector<std::string>{}, stopped_by_us);
  // Order by when the agent saw each exit (SIGCHLD, sub-millisecond), not by an error file's
  // whole-second timestamp, so the first failure really is the root cause.
  f.time = w.exit_time;
  if (progress.stalled) {
    // The agent ended it, but the stall is the failure: the root cause, with its stacks.
    f.teardown = false;
    f.message = progress.stall_message;
    f.traceback = progress.stall_message + "\n";
    for (const std::string& line : progress.stack_excerpt) f.traceback += line + "\n";
    f.time = progress.stall_time;
  } else if (w.timer_expiry) {
    // Killed for an expired FileTimer scope: the scope is the failure.
    f.teardown = false;
    f.message = w.timer_expiry->first;
    f.traceback = w.timer_expiry->first + "\n";
    f.time = w.timer_expiry->second;
  }
  if (w.d_timed_out) {
    // Ended by the agent, but the uninterruptible sleep is the failure.
    f.teardown = false;
    f.message = w.d_message;
    f.traceback = w.d_message + "\n" + kernelStackText(w.pid, w.d_stack);
    f.time = w.d_time;
  }
  return f;
}

}  // namespace

std::vector<WorkerFailure> collectFailures(const std::vector<AttemptWorker>& workers,
                                           const StallWatchdog& watchdog, int stop_signal,
                                           std::chrono::milliseconds reap_timeout) {
  std::vector<WorkerFailure> failures;
  for (size_t i = 0; i < workers.size(); ++i) {
    const AttemptWorker& w = workers[i];
    if (w.unreaped) {
      failures.push_back(unreapedFailure(w, reap_timeout));
    } else if (w.exited && w.pid > 0 && !exitedCleanly(w.status)) {
      failures.push_back(exitFailure(w, watchdog.worker(i), stop_signal));
    }
  }
  return failures;
}

std::vector<RankState> attemptRankStates(const std::vector<AttemptWorker>& workers,
                                         const StallWatchdog& watchdog) {
  std::vector<RankState> states = watchdog.rankStates();
  for (RankState& s : states) {
    for (const AttemptWorker& w : workers) {
      if (w.pid != s.pid || !s.exited) continue;
      s.exit_code = WIFSIGNALED(w.status) ? -WTERMSIG(w.status) : WEXITSTATUS(w.status);
    }
  }
  return states;
}

std::string applyNodeStallVerdict(const std::vector<RankState>& states,
                                  std::vector<WorkerFailure>& failures, int attempt,
                                  EventLog* log) {
  if (states.empty()) return "";
  auto verdict = decideStall(states);
  if (!verdict) return "";
  applyStallVerdict(*verdict, states, failures);
  CPPRUN_LOG(kError) << "attempt " << attempt << " hung: " << verdict->summary;
  emitEvent(log, "stall_verdict", stallVerdictEvent(attempt, *verdict, states));
  return "hang: " + verdict->summary;
}

std::vector<WorkerFailure> mergedFailures(std::vector<WorkerFailure> job,
                                          std::vector<WorkerFailure> own) {
  for (WorkerFailure& f : own) {
    const bool listed = std::any_of(job.begin(), job.end(),
                                    [&](const WorkerFailure& j) { return j.rank == f.rank; });
    if (!listed) job.push_back(std::move(f));
  }
  return job;
}

void noteHangVerdict(HangVerdictSnapshot& hang, int attempt, const std::string& summary,
                     const std::vector<WorkerFailure>& failures) {
  if (summary.rfind("hang: ", 0) != 0) return;
  hang.attempt = attempt;
  hang.summary = summary;
  hang.culprits.clear();
  hang.waiting.clear();
  for (const WorkerFailure& f : failures) {
    if (f.waiting) {
      hang.waiting.push_back(f.rank);
    } else if (f.message.rfind(kHangCulpritPrefix, 0) == 0) {
      hang.culprits.push_back(f.rank);
    }
  }
  ++hang.verdicts_total;
  hang.culprits_total += hang.culprits.size();
}

namespace {

std::string describeTimerExpiry(const FileTimerServer::Expiry& e, pid_t worker_pid) {
  std::ostringstream text;
  text << "FileTimer scope '" << e.scope_id << "' expired " << std::fixed << std::setprecision(1)
       << std::max(0.0, e.expiration_time - e.armed_at) << " s after it was armed";
  if (e.seen_at - e.expiration_time >= 0.05) {
    text << " (acted on " << std::setprecision(2) << e.seen_at - e.expiration_time
         << " s after its expiry)";
  }
  text << "; cpprun sent " << signalName(e.signal) << " to pid " << e.pid;
  if (e.pid != worker_pid) text << " (a descendant of the worker)";
  if (!e.kill_error.empty()) text << ", which failed: " << e.kill_error;
  if (e.scopes.size() > 1) {
    text << "; expired with it:";
    for (const std::string& scope : e.scopes) {
      if (scope != e.scope_id) text << " '" << scope << "'";
    }
  }
  return text.str();
}

}  // namespace

void recordTimerExpiry(AttemptWorker& w, const FileTimerServer::Expiry& e, int attempt,
                       EventLog* log) {
  const std::string message = describeTimerExpiry(e, w.pid);
  const auto expired_at = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(e.expiration_time)));
  w.timer_expiry = std::make_pair(message, expired_at);
  CPPRUN_LOG(kError) << "rank " << w.spec.rank << " (pid " << w.pid << "): " << message
                     << "; stopping the workers";
  emitEvent(log, "file_timer_expired",
            {{"attempt", attempt},
             {"rank", w.spec.rank},
             {"local_rank", w.spec.local_rank},
             {"pid", e.pid},
             {"worker_pid", w.pid},
             {"scope_id", e.scope_id},
             {"signal", signalName(e.signal)},
             {"armed_at", e.armed_at},
             {"expiration_time", e.expiration_time},
             {"message", message}});
}

AttemptReport nodeReport(AttemptEnd end, std::vector<WorkerFailure> failures,
                         const Status& start_error, int signal) {
  AttemptReport report;
  report.failures = std::move(failures);
  switch (end) {
    case AttemptEnd::kStartFailed:
      report.kind = AttemptReport::Kind::kStartFailed;
      report.error = start_error.message();
      break;
    case AttemptEnd::kSignalled:
      report.kind = AttemptReport::Kind::kSignalled;
      report.signal = signal;
      break;
    case AttemptEnd::kLostPeers:  // not reported: the job ends on this node instead
    case AttemptEnd::kWorkersFailed:
      report.kind = AttemptReport::Kind::kFailed;
      break;
    case AttemptEnd::kStoppedByPeer:
      report.kind = AttemptReport::Kind::kStopped;
      break;
    case AttemptEnd::kSucceeded:
      report.kind = AttemptReport::Kind::kSucceeded;
      break;
  }
  return report;
}

JobOutcome jobOutcome(AttemptEnd end, const Status& lost_error, const Status& start_error,
                      int signal) {
  JobOutcome outcome;
  switch (end) {
    case AttemptEnd::kLostPeers:
      outcome.kind = JobOutcome::Kind::kLostPeers;
      outcome.error = lost_error;
      break;
    case AttemptEnd::kStartFailed:
      outcome.kind = JobOutcome::Kind::kStartFailed;
      outcome.error = start_error;
      break;
    case AttemptEnd::kSignalled:
      outcome.kind = JobOutcome::Kind::kSignalled;
      outcome.signal = signal;
      break;
    case AttemptEnd::kWorkersFailed:
      outcome.kind = JobOutcome::Kind::kWorkersFailed;
      break;
    case AttemptEnd::kStoppedByPeer:  // the job's decision said how it ended: not a failure
    case AttemptEnd::kSucceeded:
      outcome.kind = JobOutcome::Kind::kSucceeded;
      break;
  }
  return outcome;
}

nlohmann::json failureEvent(const WorkerFailure& f) {
  nlohmann::json fields = {
      {"rank", f.rank}, {"local_rank", f.local_rank}, {"pid", f.pid}, {"message", f.message}};
  if (f.signal > 0) {
    fields["signal"] = signalName(f.signal);
  } else {
    fields["exit_code"] = f.exit_code;
  }
  if (!f.host.empty()) fields["failed_host"] = f.host;
  if (!f.error_file.empty()) fields["error_file"] = f.error_file;
  if (!f.traceback.empty()) fields["traceback"] = f.traceback;
  if (f.collateral) fields["collateral"] = true;
  if (f.waiting) fields["waiting"] = true;
  if (f.unreaped) {
    fields["unreaped"] = true;
    fields["state"] = f.state == 0 ? std::string() : std::string(1, f.state);
    fields["wchan"] = f.wchan;
  }
  return fields;
}

void emitJobEvents(EventLog* log, const JobOutcome& outcome) {
  if (log == nullptr) return;
  if (!outcome.failures.empty() && (outcome.kind == JobOutcome::Kind::kWorkersFailed ||
                                    outcome.kind == JobOutcome::Kind::kUnreaped)) {
    nlohmann::json root = failureEvent(outcome.failures[rootCauseIndex(outcome.failures)]);
    if (!outcome.summary.empty()) root["summary"] = outcome.summary;
    log->emit("root_cause", root);
  }
  nlohmann::json fields = {{"outcome", jobOutcomeName(outcome.kind)},
                           {"exit_code", outcome.exitCode()},
                           {"restarts", outcome.restarts}};
  if (!outcome.error.isOk()) fields["error"] = outcome.error.message();
  if (outcome.signal != 0) fields["signal"] = signalName(outcome.signal);
  log->emit("job_finished", fields);
}

}  // namespace cpprun::agent
