#include "agent/supervision/supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <map>
#include <optional>
#include <utility>

#include "agent/supervision/attempt_failures.h"
#include "agent/supervision/attempt_teardown.h"
#include "agent/supervision/attempt_worker.h"
#include "agent/supervision/uninterruptible_check.h"
#include "agent/supervision/worker_wiring.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/progress_file.h"
#include "common/wait_notice.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using SystemClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;

int JobOutcome::exitCode() const {
  switch (kind) {
    case Kind::kSucceeded:
      return 0;
    case Kind::kWorkersFailed:
      return 1;
    case Kind::kSignalled:
      return 128 + signal;
    case Kind::kStartFailed:
      return 3;
    case Kind::kLostPeers:
      return 4;
    case Kind::kLeft:
    case Kind::kNotNeeded:
      return 0;
    case Kind::kUnhealthy:
      return 5;
    case Kind::kExcluded:
      return 6;
    case Kind::kUnreaped:
      return 7;
  }
  return 1;
}

const char* jobOutcomeName(JobOutcome::Kind kind) {
  switch (kind) {
    case JobOutcome::Kind::kSucceeded:
      return "succeeded";
    case JobOutcome::Kind::kWorkersFailed:
      return "workers_failed";
    case JobOutcome::Kind::kSignalled:
      return "signalled";
    case JobOutcome::Kind::kStartFailed:
      return "start_failed";
    case JobOutcome::Kind::kLostPeers:
      return "lost_peers";
    case JobOutcome::Kind::kLeft:
      return "left";
    case JobOutcome::Kind::kNotNeeded:
      return "not_needed";
    case JobOutcome::Kind::kUnhealthy:
      return "unhealthy";
    case JobOutcome::Kind::kExcluded:
      return "excluded";
    case JobOutcome::Kind::kUnreaped:
      return "unreaped";
  }
  return "unknown";
}

namespace {

// The supervisor's states (supervisor.h has the diagram).
enum class State { kIdle, kRunning, kStopping, kDraining, kDone };
constexpr State kStates[] = {State::kIdle, State::kRunning, State::kStopping, State::kDraining,
                             State::kDone};

// As /status and /metrics spell it.
const char* stateName(State s) {
  switch (s) {
    case State::kIdle:
      return "waiting";
    case State::kRunning:
      return "running";
    case State::kStopping:
      return "stopping";
    case State::kDraining:
      return "draining";
    case State::kDone:
      return "done";
  }
  return "unknown";
}

}  // namespace

// The attempt's state machine (supervisor.h). Its parts, each with one job: WorkerWiring starts
// a worker with its streams, AttemptTeardown stops and drains an attempt, UninterruptibleCheck
// and the StallWatchdog fail a running one, attempt_failures.h reports it, and decideAttempt
// (restart_policy.h) says what follows.
class Supervisor::Impl : public std::enable_shared_from_this<Supervisor::Impl> {
 public:
  Impl(asio::io_context& io, ProcessLauncher& launcher, SupervisorOptions options,
       PrepareAttempt prepare, OnDone on_done)
      : io_(io),
        launcher_(launcher),
        options_(std::move(options)),
        sinks_(options_.sinks ? options_.sinks
                              : std::make_shared<OutputSinks>(options_.output.console_stdout_fd,
                                                              options_.output.console_stderr_fd)),
        prepare_(std::move(prepare)),
        on_done_(std::move(on_done)),
        wiring_(io,
                {options_.output, options_.stdin_forwarder, options_.stall.timeout,
                 options_.stall.python_progress, options_.warm_restart},
                sinks_),
        teardown_(io, launcher, workers_,
                  {options_.shutdown_timeout, options_.reap_timeout, options_.drain_timeout,
                   options_.event_log, options_.stdin_forwarder},
                  {[this] { setState(State::kDraining); }, [this] { onDrained(); },
                   [this](size_t index) { watchdog_.workerExited(index); }}),
        uninterruptible_(io, launcher, workers_, options_.uninterruptible_timeout,
                         options_.event_log,
                         [this](const std::string& ranks) { onUninterruptible(ranks); }),
        watchdog_(io, launcher, options_.stall, options_.track_progress, options_.event_log,
                  {nullptr, [this](const std::vector<size_t>& stalled) { onStalled(stalled); }}),
        state_since_(SteadyClock::now()) {
    if (options_.file_timer.enabled) {
      FileTimerServer::Callbacks callbacks;
      callbacks.owner = [this](pid_t pid) { return timerOwner(pid); };
      callbacks.on_expired = [this](const FileTimerServer::Expiry& e) { onTimerExpired(e); };
      file_timer_ = std::make_unique<FileTimerServer>(io_, options_.file_timer.path, callbacks);
    }
  }

  void setState(State s) {
    // Progress is checked only while the attempt runs.
    if (state_ == State::kRunning && s != State::kRunning) {
      watchdog_.stopChecks();
      if (file_timer_) file_timer_->endAttempt();  // teardown: no timer fails it again
      uninterruptible_.stop();
    }
    const auto now = SteadyClock::now();
    state_seconds_[state_] += std::chrono::duration<double>(now - state_since_).count();
    state_since_ = now;
    state_ = s;
  }

  void startAttempt() {
    if (options_.coordinator == nullptr && !options_.before_attempt) return launchAttempt();
    // Every node must be ready (its previous attempt torn down) before any starts this one. One
    // node: its check first (before_attempt); prepare_ then fails the attempt if the check did.
    setState(State::kIdle);
    early_peer_stop_.reset();
    auto current = [weak = weak_from_this(), n = restart_count_] {
      auto self = weak.lock();
      return self && self->state_ != State::kDone && n == self->restart_count_ ? self : nullptr;
    };
    if (options_.coordinator == nullptr) {
      return options_.before_attempt(restart_count_, [current] {
        if (auto self = current()) self->launchAttempt();
      });
    }
    options_.coordinator->beginAttempt(restart_count_, [current](Result<AttemptStart> r) {
      if (auto self = current()) self->onAttemptStart(r);
    });
  }

  // Multi-node: what the nodes agreed for the attempt (or why there is none).
  void onAttemptStart(const Result<AttemptStart>& r) {
    if (!r.isOk()) {
      const Status& s = r.status();
      if (s.code() == StatusCode::kAlreadyExists && s.message().rfind(kJobOverBeforeJoin, 0) == 0) {
        // A spare the job never needed: not a failure of this node.
        not_needed_ = true;
        summary_ = s.message();
      } else if (s.code() == StatusCode::kAlreadyExists &&
                 s.message().rfind(kLeftWhileSpare, 0) == 0) {
        leaving_ = true;  // a spare drained while it waited
        summary_ = s.message();
      } else {
        lost_error_ = s;
      }
      finishJob();
      return;
    }
    attempt_start_ = r.value();
    // The job's attempt number: an agent that joined an elastic job late starts there.
    restart_count_ = r.value().attempt;
    launchAttempt();
    // Another node stopped this attempt before it started here (its workers could not start,
    // say): these workers must not run on alone.
    if (auto stop = std::exchange(early_peer_stop_, std::nullopt)) {
      onPeerStop(stop->attempt, stop->reason, stop->signal, stop->stall);
    }
  }

  // The previous attempt's workers go (their output counted) and `count` new ones take their
  // place.
  void replaceWorkers(size_t count) {
    for (const AttemptWorker& w : workers_) output_bytes_before_ += w.outputBytes();
    workers_.clear();
    workers_.resize(count);
  }

  void launchAttempt() {
    auto attempt = prepare_(restart_count_);
    if (attempt.isOk() && file_timer_) {
      if (Status opened = file_timer_->open(); !opened.isOk()) attempt = opened;
    }
    if (!attempt.isOk()) {
      start_error_ = attempt.status();
      if (options_.coordinator != nullptr) {
        // Multi-node: the others got the go too. Stop their workers and report, so the job's
        // decision names this node (as for a worker that cannot be spawned) instead of the
        // others losing it.
        CPPRUN_LOG(kError) << start_error_.message();
        replaceWorkers(0);
        peer_stopped_ = false;
        announce("node could not start its workers: " + start_error_.message());
        finishAttempt();
        return;
      }
      finishJob();
      return;
    }
    AttemptSpec& spec = attempt.value();
    replaceWorkers(spec.workers.size());
    setState(State::kRunning);
    attempt_failed_ = false;
    watchdog_.beginAttempt(restart_count_, workers_.size());
    if (file_timer_) file_timer_->beginAttempt();
    peer_stopped_ = false;
    teardown_.beginAttempt();
    const Status wired = wiring_.beginAttempt(spec.attempt_dir, watchdog_.stallDetectionOn());
    for (size_t i = 0; i < workers_.size(); ++i) {
      workers_[i].spec = std::move(spec.workers[i]);
      Status s = wired.isOk() ? startWorker(i, spec.attempt_dir) : wired;
      if (!s.isOk()) {
        start_error_ = s;
        // Workers that never started count as exited; stop those that did, promptly.
        for (size_t j = i; j < workers_.size(); ++j) {
          if (workers_[j].pid < 0) workers_[j].exited = true;
        }
        CPPRUN_LOG(kError) << s.message();
        announce("node could not start its workers: " + s.message());
        beginStop(SIGKILL);
        return;
      }
    }
    const auto& first = workers_.front().spec;
    const auto& last = workers_.back().spec;
    CPPRUN_LOG(kInfo) << "attempt " << restart_count_ << ": started " << workers_.size()
                      << " workers (ranks " << first.rank << ".." << last.rank << ")";
    watchdog_.startChecks();
    uninterruptible_.start(restart_count_);
  }

  Status startWorker(size_t index, const std::string& attempt_dir) {
    AttemptWorker& w = workers_[index];
    const std::string rank_dir =
        attempt_dir.empty() ? "" : attempt_dir + "/" + std::to_string(w.spec.local_rank);
    std::map<std::string, std::string> env = w.spec.env;
    if (file_timer_) env["TORCHELASTIC_TIMER_FILE"] = file_timer_->path();
    if (!rank_dir.empty()) {
      env[kProgressFileVariable] = StallWatchdog::progressFile(rank_dir);
      env["CPPRUN_STACK_FILE"] = StallWatchdog::stackFile(rank_dir);
      env[kCollectiveFileVariable] = StallWatchdog::collectiveFile(rank_dir);
    }
    auto eof = [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->teardown_.onOutputEof();
    };
    if (Status s = wiring_.spawn(w, rank_dir, std::move(env), launcher_, eof); !s.isOk()) {
      return s;
    }
    watchdog_.workerStarted(index, {w.spec.rank, w.spec.local_rank, w.pid, rank_dir});
    ++workers_started_;
    nlohmann::json started = {{"attempt", restart_count_},
                              {"rank", w.spec.rank},
                              {"local_rank", w.spec.local_rank},
                              {"pid", w.pid},
                              {"program", w.spec.argv.empty() ? "" : w.spec.argv.front()}};
    if (!w.spec.binding.empty()) started["numa_binding"] = w.spec.binding;
    emitEvent(options_.event_log, "worker_started", started);
    return Status::ok();
  }

  // A worker stayed in uninterruptible sleep for the timeout (UninterruptibleCheck).
  void onUninterruptible(const std::string& ranks) {
    // As torch: a wedged worker holds a kernel resource (GPU, NIC) a fresh one would conflict
    // with, so the group is not restarted.
    no_restart_ = true;
    attempt_failed_ = true;
    announce("rank(s) " + ranks + " in uninterruptible sleep (D state) for " +
             formatWait(options_.uninterruptible_timeout));
    beginStop(SIGTERM);
  }

  // The watchdog found ranks stalled and collected their stacks: fail the attempt, unless
  // something else stopped it meanwhile.
  void onStalled(const std::vector<size_t>& indices) {
    if (state_ != State::kRunning) return;
    std::string ranks;
    for (size_t i : indices) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(workers_[i].spec.rank);
    }
    attempt_failed_ = true;
    const std::string reason = "rank(s) " + ranks + " stalled (no progress for " +
                               formatWait(options_.stall.timeout) + ")";
    if (options_.coordinator != nullptr)
      options_.coordinator->announceStall(restart_count_, reason);
    CPPRUN_LOG(kError) << "stopping the workers: rank(s) " << ranks << " stalled";
    beginStop(SIGTERM);
  }

  // The worker `pid` is, or descends from (FileTimer requests): only running workers count.
  std::optional<size_t> timerOwner(pid_t pid) const {
    std::vector<pid_t> roots;
    for (const AttemptWorker& w : workers_) roots.push_back(w.exited ? -1 : w.pid);
    return findOwner(pid, roots);
  }

  // A FileTimer scope expired and its pid got the signal the worker asked for: the attempt
  // fails with the scope as its root cause (torchrun would also kill itself here).
  void onTimerExpired(const FileTimerServer::Expiry& e) {
    if (state_ != State::kRunning || e.worker >= workers_.size()) return;
    AttemptWorker& w = workers_[e.worker];
    recordTimerExpiry(w, e, restart_count_, options_.event_log);
    attempt_failed_ = true;
    announce("rank " + std::to_string(w.spec.rank) + ": FileTimer scope '" + e.scope_id +
             "' expired");
    beginStop(SIGTERM);
  }

  void onChildExit(pid_t pid, int status) {
    if (watchdog_.onChildExit(pid, status)) return;  // a gdb collecting stacks
    AttemptWorker* w = find(pid);
    if (w == nullptr) return;  // an adopted orphan, or a worker of an attempt already over
    w->exited = true;
    watchdog_.workerExited(static_cast<size_t>(w - workers_.data()));
    if (file_timer_) file_timer_->workerExited(static_cast<size_t>(w - workers_.data()));
    w->status = status;
    w->exit_time = SystemClock::now();
    w->exited_during_stop = state_ == State::kStopping;
    if (options_.event_log != nullptr) {
      nlohmann::json fields = {{"attempt", restart_count_},
                               {"rank", w->spec.rank},
                               {"local_rank", w->spec.local_rank},
                               {"pid", pid},
                               {"during_teardown", w->exited_during_stop}};
      if (WIFSIGNALED(status)) {
        fields["signal"] = signalName(WTERMSIG(status));
      } else {
        fields["exit_code"] = WEXITSTATUS(status);
      }
      emitEvent(options_.event_log, "worker_exited", fields);
    }
    if (state_ == State::kRunning && !exitedCleanly(status)) {
      CPPRUN_LOG(kError) << "rank " << w->spec.rank << " (local_rank " << w->spec.local_rank
                         << ", pid " << pid << ") " << describeWaitStatus(status)
                         << "; stopping the other workers";
      attempt_failed_ = true;
      announce("rank " + std::to_string(w->spec.rank) + " " + describeWaitStatus(status));
      beginStop(SIGTERM);
      return;
    }
    if (state_ == State::kStopping || !exitedCleanly(status)) {
      CPPRUN_LOG(kInfo) << "rank " << w->spec.rank << " (pid " << pid << ") "
                        << describeWaitStatus(status);
    }
    if (state_ == State::kRunning && allExited()) {
      teardown_.beginDrain();  // every worker exited 0
    } else if (state_ == State::kStopping) {
      teardown_.onWorkerExited();
    }
  }

  void onSignal(int signo) {
    if (state_ == State::kDone) return;
    received_signal_ = signo;
    CPPRUN_LOG(kWarn) << "received " << signalName(signo) << "; forwarding it to the workers";
    emitEvent(options_.event_log, "signal_received",
              {{"signal", signalName(signo)}, {"attempt", restart_count_}});
    if (state_ == State::kRunning) announce("received " + signalName(signo), signo);
    switch (state_) {
      case State::kIdle:
        finishJob();
        break;
      case State::kRunning:
        beginStop(signo);
        break;
      case State::kStopping:
        teardown_.signalWorkers(signo);  // the user insists: pass it on again
        break;
      case State::kDraining:
      case State::kDone:
        break;
    }
  }

  // Multi-node: claim the attempt's stop so every other node tears its workers down too.
  void announce(const std::string& reason, int signo = 0) {
    if (options_.coordinator != nullptr) {
      options_.coordinator->announceStop(restart_count_, reason, signo);
    }
  }

  void onPeerStop(int n, const std::string& reason, int signo, bool stall) {
    if (state_ == State::kIdle && options_.coordinator != nullptr) {
      // The attempt's start is on its way (the stop and the start are posted from different
      // threads of the coordinator): act on it once the workers are up.
      early_peer_stop_ = PeerStopNote{n, reason, signo, stall};
      return;
    }
    if (n != restart_count_ || state_ != State::kRunning) return;
    if (stall && signo == 0 && watchdog_.stallDetectionOn() && !peer_stopped_) {
      // Who caused the hang may be here: every rank's state first, then the teardown.
      CPPRUN_LOG(kWarn) << "another node stopped attempt " << n << " (" << reason
                        << "); taking every rank's state before stopping the workers";
      peer_stopped_ = true;
      watchdog_.collectForPeer([weak = weak_from_this(), n] {
        auto self = weak.lock();
        if (self && self->restart_count_ == n && self->state_ == State::kRunning) {
          self->beginStop(SIGTERM);
        }
      });
      return;
    }
    if (signo != 0) {
      CPPRUN_LOG(kWarn) << "another node stopped attempt " << n << " (" << reason
                        << "); forwarding " << signalName(signo) << " to the workers";
    } else {
      CPPRUN_LOG(kWarn) << "another node stopped attempt " << n << " (" << reason
                        << "); stopping the workers";
    }
    peer_stopped_ = true;
    beginStop(signo != 0 ? signo : SIGTERM);
  }

  void onLeave(const std::string& why) {
    if (state_ == State::kDone) return;
    CPPRUN_LOG(kWarn) << "leaving the job (" << why
                      << "); stopping this node's workers, the other nodes go on without it";
    // Also when the attempt ended meanwhile (the claim is made): the decision then ends this
    // node's job instead of a next attempt.
    leaving_ = true;
    if (state_ != State::kRunning) return;
    peer_stopped_ = true;  // the job's decision says how the attempt ended, not this node
    beginStop(SIGTERM);
  }

  void onCoordinatorLost(const Status& status) {
    if (state_ == State::kDone) return;
    CPPRUN_LOG(kError) << status.message() << "; stopping the workers";
    lost_error_ = status;
    if (state_ == State::kRunning) {
      beginStop(SIGTERM);
    } else if (state_ == State::kIdle) {
      finishJob();  // between attempts: nothing is running
    }
  }

  void beginStop(int signo) {
    setState(State::kStopping);
    teardown_.beginStop(signo, restart_count_);
  }

  // The attempt's output is complete (AttemptTeardown): decide what follows.
  void onDrained() {
    // Leave the output callbacks' stacks before starting anything new.
    asio::post(io_, [weak = weak_from_this()] {
      auto self = weak.lock();
      if (self && self->state_ == State::kIdle) self->finishAttempt();
    });
    setState(State::kIdle);
  }

  AttemptFacts facts() const {
    AttemptFacts f;
    f.lost_peers = !lost_error_.isOk();
    f.start_failed = !start_error_.isOk();
    f.signal = received_signal_;
    f.workers_failed = attempt_failed_;
    // One node has no peers (a leave there ends the job as a success, kLeft).
    f.peer_stopped = peer_stopped_ && options_.coordinator != nullptr;
    return f;
  }

  // A worker SIGKILL did not end, or one wedged in uninterruptible sleep, holds what a new
  // group would need (its GPU): no restart on this node.
  bool wedged() const { return teardown_.anyUnreaped() || no_restart_; }

  void finishAttempt() {
    failures_ = collectFailures(workers_, watchdog_, teardown_.stopSignal(), options_.reap_timeout);
    rank_states_ = attemptRankStates(workers_, watchdog_);
    // One node: the hang's verdict is this node's to make (multi-node: the decider's).
    if (options_.coordinator == nullptr) {
      std::string verdict =
          applyNodeStallVerdict(rank_states_, failures_, restart_count_, options_.event_log);
      if (!verdict.empty() || summary_.rfind("hang: ", 0) == 0) summary_ = std::move(verdict);
      noteHangVerdict(last_hang_, restart_count_, summary_, failures_);
    }
    for (const WorkerFailure& f : failures_) {
      if (f.teardown) continue;
      ++worker_failures_;
      emitEvent(options_.event_log, "failure", failureEvent(f));
    }
    if (options_.coordinator != nullptr && lost_error_.isOk()) {
      endAttemptWithPeers();
      return;
    }
    const AttemptVerdict verdict =
        decideAttempt(facts(), !wedged() && restart_count_ < options_.max_restarts);
    if (verdict.restart) {
      ++restart_count_;
      CPPRUN_LOG(kWarn) << "worker group failed; restarting it (restart " << restart_count_
                        << " of " << options_.max_restarts << ")";
      emitEvent(options_.event_log, "restart",
                {{"restart", restart_count_}, {"max_restarts", options_.max_restarts}});
      startAttempt();
      return;
    }
    if (verdict.end == AttemptEnd::kWorkersFailed && wedged()) {
      CPPRUN_LOG(kError) << "worker group failed with a worker "
                         << (teardown_.anyUnreaped() ? "that SIGKILL did not end"
                                                     : "in uninterruptible sleep")
                         << "; not restarting it";
    } else if (verdict.end == AttemptEnd::kWorkersFailed && options_.max_restarts > 0) {
      CPPRUN_LOG(kError) << "worker group failed and all " << options_.max_restarts
                         << " restarts are used";
    }
    finishJob();
  }

  // Multi-node: tell the others how this node's attempt ended; act on the job's decision.
  void endAttemptWithPeers() {
    // The restart is the job's decision (the host's), not this node's.
    AttemptReport report = nodeReport(decideAttempt(facts(), /*restart_left=*/false).end, failures_,
                                      start_error_, received_signal_);
    report.rank_states = rank_states_;
    setState(State::kIdle);
    options_.coordinator->endAttempt(
        restart_count_, report,
        [weak = weak_from_this(), n = restart_count_](Result<JobDecision> r) {
          auto self = weak.lock();
          if (!self || self->state_ == State::kDone || n != self->restart_count_) return;
          self->onDecision(r);
        });
  }

  void onDecision(const Result<JobDecision>& r) {
    if (!r.isOk()) {
      lost_error_ = r.status();
      finishJob();
      return;
    }
    const JobDecision& d = r.value();
    summary_ = d.summary;
    noteHangVerdict(last_hang_, restart_count_, d.summary, d.failures);
    switch (d.kind) {
      case JobDecision::Kind::kRestart:
        if (leaving_) break;  // the others re-form without this node
        // A wedged worker holds this node's GPU: it cannot take part in the next attempt.
        if (wedged()) break;
        ++restart_count_;
        emitEvent(options_.event_log, "restart",
                  {{"restart", restart_count_},
                   {"restarts_used", d.restarts_used},
                   {"max_restarts", options_.max_restarts},
                   {"membership_change", d.membership_change},
                   {"reason", d.summary}});
        if (d.membership_change) {
          CPPRUN_LOG(kWarn) << "the job's membership changes (" << d.summary
                            << "); re-forming the group (restarts used: " << d.restarts_used
                            << " of " << options_.max_restarts << ")";
        } else {
          CPPRUN_LOG(kWarn) << "the job's worker groups failed (" << d.summary
                            << "); restarting every node (restart " << d.restarts_used << " of "
                            << options_.max_restarts << ")";
        }
        startAttempt();
        return;
      case JobDecision::Kind::kSucceeded:
        attempt_failed_ = false;
        start_error_ = Status::ok();
        break;
      case JobDecision::Kind::kFailed:
        attempt_failed_ = true;
        failures_ = mergedFailures(d.failures, std::move(failures_));
        if (!start_error_.isOk()) start_error_ = Status::ok();  // reported as a failure
        break;
      case JobDecision::Kind::kStopped:
        if (received_signal_ == 0) received_signal_ = d.signal;
        break;
    }
    finishJob();
  }

  void finishJob() {
    setState(State::kDone);
    if (file_timer_) file_timer_->close();  // the pipe goes with the job
    teardown_.cancel();
    JobOutcome outcome = jobOutcome(decideAttempt(facts(), /*restart_left=*/false).end, lost_error_,
                                    start_error_, received_signal_);
    outcome.restarts = restart_count_;
    outcome.failures = failures_;
    outcome.summary = summary_;
    if (outcome.kind == JobOutcome::Kind::kSucceeded && leaving_) {
      outcome.kind = JobOutcome::Kind::kLeft;
    } else if (outcome.kind == JobOutcome::Kind::kSucceeded && not_needed_) {
      outcome.kind = JobOutcome::Kind::kNotNeeded;
    }
    if (options_.amend_outcome) options_.amend_outcome(outcome);
    // Whatever else happened, a process is left that nothing can kill: the node needs a look.
    if (teardown_.anyUnreaped()) outcome.kind = JobOutcome::Kind::kUnreaped;
    emitJobEvents(options_.event_log, outcome);
    if (on_done_) on_done_(outcome);
  }

  SupervisorSnapshot snapshot() {
    // Fresh progress for the reader (what the worker wrote a moment ago is in the answer).
    if (state_ == State::kRunning) watchdog_.refresh();
    SupervisorSnapshot snap;
    snap.state = stateName(state_);
    snap.restart_count = restart_count_;
    const auto now = SteadyClock::now();
    for (State s : kStates) snap.seconds_in_state[stateName(s)] = state_seconds_[s];
    snap.seconds_in_state[stateName(state_)] +=
        std::chrono::duration<double>(now - state_since_).count();
    snap.output_bytes_total = output_bytes_before_;
    snap.console_lines_dropped_total = sinks_->dropped_console_lines.load();
    snap.log_lines_dropped_total = sinks_->dropped_log_lines.load();
    for (size_t i = 0; i < workers_.size(); ++i) {
      WorkerSnapshot ws = snapshotOf(workers_[i], watchdog_.worker(i), now);
      snap.output_bytes_total += ws.stdout_bytes + ws.stderr_bytes;
      snap.workers.push_back(std::move(ws));
    }
    snap.workers_started_total = workers_started_;
    snap.worker_failures_total = worker_failures_;
    snap.stalls_total = watchdog_.stallsTotal();
    snap.last_hang = last_hang_;
    return snap;
  }

  AttemptWorker* find(pid_t pid) {
    for (AttemptWorker& w : workers_) {
      if (w.pid == pid && !w.exited) return &w;
    }
    return nullptr;
  }

  bool allExited() const {
    for (const AttemptWorker& w : workers_) {
      if (!w.exited) return false;
    }
    return true;
  }

  // Declaration order is construction order: the parts below hold references to workers_.
  asio::io_context& io_;
  ProcessLauncher& launcher_;
  SupervisorOptions options_;
  std::shared_ptr<OutputSinks> sinks_;
  PrepareAttempt prepare_;
  OnDone on_done_;
  std::vector<AttemptWorker> workers_;  // the current attempt's
  WorkerWiring wiring_;
  AttemptTeardown teardown_;
  UninterruptibleCheck uninterruptible_;
  StallWatchdog watchdog_;
  std::unique_ptr<FileTimerServer> file_timer_;  // TORCHELASTIC_ENABLE_FILE_TIMER=1 only
  SteadyClock::time_point state_since_;
  std::map<State, double> state_seconds_;
  bool no_restart_ = false;  // a worker stayed in uninterruptible sleep: no restart (torch)
  uint64_t output_bytes_before_ = 0;
  uint64_t workers_started_ = 0;
  uint64_t worker_failures_ = 0;
  State state_ = State::kIdle;
  int restart_count_ = 0;
  std::vector<WorkerFailure> failures_;
  std::vector<RankState> rank_states_;  // the attempt's stall snapshot (empty: no stall)
  HangVerdictSnapshot last_hang_;
  bool attempt_failed_ = false;
  bool peer_stopped_ = false;
  bool leaving_ = false;     // onLeave: this node leaves the job after this attempt
  bool not_needed_ = false;  // a spare that found the job over
  struct PeerStopNote {
    int attempt;
    std::string reason;
    int signal;
    bool stall;
  };
  std::optional<PeerStopNote> early_peer_stop_;  // a peer's stop that came before the start
  Status lost_error_;
  std::optional<AttemptStart> attempt_start_;
  std::string summary_;
  int received_signal_ = 0;
  Status start_error_;
};

Supervisor::Supervisor(asio::io_context& io, ProcessLauncher& launcher, SupervisorOptions options,
                       PrepareAttempt prepare, OnDone on_done)
    : impl_(std::make_shared<Impl>(io, launcher, std::move(options), std::move(prepare),
                                   std::move(on_done))) {
  impl_->sinks_->attachLoop(&io);
}

Supervisor::~Supervisor() {
  // The writers' completions go to the loop, which may end with the supervisor's owner.
  impl_->sinks_->attachLoop(nullptr);
  // Writers the supervisor made itself end with it. (Sinks from the options are their owner's.)
  if (!impl_->options_.sinks) {
    impl_->sinks_->stop(kConsoleExitFlush, kFileExitFlush);
  }
}

void Supervisor::start() { impl_->startAttempt(); }
void Supervisor::onChildExit(pid_t pid, int wait_status) { impl_->onChildExit(pid, wait_status); }
void Supervisor::onSignal(int signo) { impl_->onSignal(signo); }
void Supervisor::onWindowChange() { impl_->wiring_.resizeTerminals(impl_->workers_); }
void Supervisor::onPeerStop(int restart_count, const std::string& reason, int signal, bool stall) {
  impl_->onPeerStop(restart_count, reason, signal, stall);
}
const std::optional<AttemptStart>& Supervisor::attemptStart() const {
  return impl_->attempt_start_;
}
void Supervisor::onCoordinatorLost(const Status& status) { impl_->onCoordinatorLost(status); }
void Supervisor::onLeave(const std::string& why) { impl_->onLeave(why); }
bool Supervisor::done() const { return impl_->state_ == State::kDone; }
int Supervisor::restartCount() const { return impl_->restart_count_; }

SupervisorSnapshot Supervisor::snapshot() const { return impl_->snapshot(); }

std::vector<pid_t> Supervisor::runningPids() const {
  std::vector<pid_t> pids;
  for (const auto& w : impl_->workers_) {
    if (w.pid > 0 && !w.exited) pids.push_back(w.pid);
  }
  return pids;
}

}  // namespace cpprun::agent
