#include "agent/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "agent/python_progress.h"
#include "agent/stdin_forwarder.h"
#include "agent/stuck_process.h"
#include "agent/worker_terminal.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/progress_file.h"
#include "common/wait_notice.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using SystemClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by " + signalName(WTERMSIG(status));
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// At the reap bound, a worker that is already dead (a zombie, or gone) but not yet reported by
// the reaper is looked at once more this much later instead of being reported as stuck.
constexpr milliseconds kReapRecheck{100};

milliseconds sinceMs(SteadyClock::time_point t, SteadyClock::time_point now) {
  return std::chrono::duration_cast<milliseconds>(now - t);
}

}  // namespace

class Supervisor::Impl : public std::enable_shared_from_this<Supervisor::Impl> {
 public:
  enum class State { kIdle, kRunning, kStopping, kDraining, kDone };
  static constexpr State kStates[] = {State::kIdle, State::kRunning, State::kStopping,
                                      State::kDraining, State::kDone};

  // As /status and /metrics spell it.
  static const char* stateName(State s) {
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

  struct Worker {
    WorkerSpec spec;
    pid_t pid = -1;
    bool exited = false;
    int status = 0;
    SystemClock::time_point exit_time;
    bool exited_during_stop = false;
    // A FileTimer scope of this worker expired (its root cause): what and when.
    std::optional<std::pair<std::string, SystemClock::time_point>> timer_expiry;
    // Uninterruptible sleep: since when every check saw it in D (torch's dwell), and whether
    // that lasted the timeout (then the failure's message and time say so).
    std::optional<SteadyClock::time_point> d_since;
    bool d_timed_out = false;
    std::string d_message;
    std::vector<std::string> d_stack;  // its kernel stack then, where readable
    SystemClock::time_point d_time;
    // Still alive the reap bound after SIGKILL: given up on (exited is set too) and described.
    bool unreaped = false;
    StuckProcess unreaped_as;
    std::unique_ptr<WorkerOutput> out;
    std::unique_ptr<WorkerOutput> err;
  };

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
        stop_timer_(io),
        drain_timer_(io),
        notice_timer_(io),
        dstate_timer_(io),
        reap_timer_(io),
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
      dstate_timer_.cancel();
    }
    const auto now = SteadyClock::now();
    state_seconds_[state_] += std::chrono::duration<double>(now - state_since_).count();
    state_since_ = now;
    state_ = s;
  }

  void startAttempt() {
    if (options_.coordinator == nullptr) {
      launchAttempt();
      return;
    }
    // Every node must be ready (its previous attempt torn down) before any starts this one.
    setState(State::kIdle);
    early_peer_stop_.reset();
    options_.coordinator->beginAttempt(
        restart_count_, [weak = weak_from_this(), n = restart_count_](Result<AttemptStart> r) {
          auto self = weak.lock();
          if (!self || self->state_ == State::kDone || n != self->restart_count_) return;
          if (!r.isOk()) {
            const Status& s = r.status();
            if (s.code() == StatusCode::kAlreadyExists &&
                s.message().rfind(kJobOverBeforeJoin, 0) == 0) {
              // A spare the job never needed: not a failure of this node.
              self->not_needed_ = true;
              self->summary_ = s.message();
            } else if (s.code() == StatusCode::kAlreadyExists &&
                       s.message().rfind(kLeftWhileSpare, 0) == 0) {
              self->leaving_ = true;  // a spare drained while it waited
              self->summary_ = s.message();
            } else {
              self->lost_error_ = s;
            }
            self->finishJob();
            return;
          }
          self->attempt_start_ = r.value();
          // The job's attempt number: an agent that joined an elastic job late starts there.
          self->restart_count_ = r.value().attempt;
          self->launchAttempt();
          // Another node stopped this attempt before it started here (its workers could not
          // start, say): these workers must not run on alone.
          if (auto stop = std::exchange(self->early_peer_stop_, std::nullopt)) {
            self->onPeerStop(stop->attempt, stop->reason, stop->signal);
          }
        });
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
        for (const Worker& w : workers_) output_bytes_before_ += outputBytes(w);
        workers_.clear();
        peer_stopped_ = false;
        announce("node could not start its workers: " + start_error_.message());
        finishAttempt();
        return;
      }
      finishJob();
      return;
    }
    for (const Worker& w : workers_) output_bytes_before_ += outputBytes(w);
    workers_.clear();
    workers_.resize(attempt.value().workers.size());
    setState(State::kRunning);
    attempt_failed_ = false;
    watchdog_.beginAttempt(restart_count_, workers_.size());
    if (file_timer_) file_timer_->beginAttempt();
    peer_stopped_ = false;
    stop_signal_ = 0;
    python_progress_dir_ = preparePythonProgress(attempt.value().attempt_dir);
    const Status copies = openFilteredCopies(attempt.value().attempt_dir);
    for (size_t i = 0; i < workers_.size(); ++i) {
      workers_[i].spec = std::move(attempt.value().workers[i]);
      Status s = copies.isOk() ? startWorker(i, attempt.value().attempt_dir) : copies;
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
    armUninterruptibleCheck();
  }

  // torch's TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: while the attempt runs, read each running
  // worker's state; one seen in D on every check for the timeout fails the attempt, no restart.
  void armUninterruptibleCheck() {
    const milliseconds timeout = options_.uninterruptible_timeout;
    if (timeout <= milliseconds(0)) return;
    dstate_timer_.expires_after(uninterruptibleCheckInterval(timeout));
    dstate_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || self->state_ != State::kRunning) return;
      if (!self->checkUninterruptible()) self->armUninterruptibleCheck();
    });
  }

  // Returns true when it failed the attempt.
  bool checkUninterruptible() {
    const milliseconds timeout = options_.uninterruptible_timeout;
    const auto now = SteadyClock::now();
    std::vector<size_t> timed_out;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (w.exited || w.pid <= 0) continue;
      const bool was_in_d = w.d_since.has_value();
      const auto dwell = updateDwell(w.d_since, launcher_.stateOf(w.pid), now);
      if (!dwell) continue;
      if (!was_in_d) {
        CPPRUN_LOG(kWarn) << "rank " << w.spec.rank << " (pid " << w.pid
                          << ") entered uninterruptible sleep (D state); the attempt fails if it "
                             "stays there for "
                          << formatWait(timeout);
        emitEvent(options_.event_log, "worker_uninterruptible",
                  {{"attempt", restart_count_},
                   {"rank", w.spec.rank},
                   {"local_rank", w.spec.local_rank},
                   {"pid", w.pid},
                   {"timeout_s", timeout.count() / 1000.0}});
      }
      if (*dwell >= timeout) timed_out.push_back(i);
    }
    if (timed_out.empty()) return false;
    std::string ranks;
    for (size_t i : timed_out) {
      Worker& w = workers_[i];
      StuckProcess p = inspectProcess(w.pid);
      if (p.state == 0) p.state = 'D';  // as the check saw it
      const double seconds = std::chrono::duration<double>(now - w.d_since.value_or(now)).count();
      w.d_timed_out = true;
      w.d_time = SystemClock::now();
      char dwell_text[32];
      std::snprintf(dwell_text, sizeof dwell_text, "%.1f s", seconds);
      w.d_message = describeStuck(p) + ": in uninterruptible sleep for " + dwell_text +
                    " (>= --uninterruptible-state-timeout " + formatWait(timeout) + ")";
      w.d_stack = p.stack;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.spec.rank);
      CPPRUN_LOG(kError) << "rank " << w.spec.rank << ": " << describeStuck(p)
                         << " stuck in uninterruptible sleep for " << dwell_text
                         << "; failing the attempt, no restart";
      nlohmann::json fields = {{"attempt", restart_count_},
                               {"rank", w.spec.rank},
                               {"local_rank", w.spec.local_rank},
                               {"seconds", seconds},
                               {"timeout_s", timeout.count() / 1000.0},
                               {"process", stuckToJson(p)}};
      emitEvent(options_.event_log, "worker_uninterruptible_timeout", fields);
    }
    // As torch: a wedged worker holds a kernel resource (GPU, NIC) a fresh one would conflict
    // with, so the group is not restarted.
    no_restart_ = true;
    attempt_failed_ = true;
    announce("rank(s) " + ranks + " in uninterruptible sleep (D state) for " + formatWait(timeout));
    beginStop(SIGTERM);
    return true;
  }

  // Where one stream of a worker goes: a pty when the route asks for one and one can be had
  // (else a pipe, after one warning), with its read end (the agent's) and write end.
  struct StreamEnds {
    int read = -1;
    int write = -1;
  };
  Status openStream(StreamRoute& route, StreamEnds& ends) {
    if (route.pty) {
      auto pty = openWorkerPty(consoleWindowSize());
      if (pty.isOk()) {
        ends = {pty.value().master, pty.value().slave};
        return Status::ok();
      }
      if (!warned_pty_) {
        warned_pty_ = true;
        CPPRUN_LOG(kWarn) << "cannot give the workers a terminal (" << pty.status().message()
                          << "); their output goes through pipes (isatty() is false in them)";
      }
      route.pty = false;
    }
    int pipe_ends[2];
    if (::pipe2(pipe_ends, O_CLOEXEC) != 0) {
      return internalError(std::string("pipe: ") + std::strerror(errno));
    }
    ends = {pipe_ends[0], pipe_ends[1]};
    return Status::ok();
  }

  // cpprun's terminal changed size: every worker pty follows.
  void onWindowChange() {
    const auto size = consoleWindowSize();
    if (!size) return;
    for (Worker& w : workers_) {
      if (w.out) w.out->resizeTerminal(*size);
      if (w.err) w.err->resizeTerminal(*size);
    }
  }

  static uint64_t outputBytes(const Worker& w) {
    return (w.out ? w.out->bytesRead() : 0) + (w.err ? w.err->bytesRead() : 0);
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
    announce("rank(s) " + ranks + " stalled (no progress for " +
             formatWait(options_.stall.timeout) + ")");
    CPPRUN_LOG(kError) << "stopping the workers: rank(s) " << ranks << " stalled";
    beginStop(SIGTERM);
  }

  // The worker `pid` is, or descends from (FileTimer requests): only running workers count.
  std::optional<size_t> timerOwner(pid_t pid) const {
    std::vector<pid_t> roots;
    for (const Worker& w : workers_) roots.push_back(w.exited ? -1 : w.pid);
    return findOwner(pid, roots);
  }

  // A FileTimer scope expired and its pid got the signal the worker asked for: the attempt
  // fails with the scope as its root cause (torchrun would also kill itself here).
  void onTimerExpired(const FileTimerServer::Expiry& e) {
    if (state_ != State::kRunning || e.worker >= workers_.size()) return;
    Worker& w = workers_[e.worker];
    std::ostringstream text;
    text << "FileTimer scope '" << e.scope_id << "' expired " << std::fixed << std::setprecision(1)
         << std::max(0.0, e.expiration_time - e.armed_at) << " s after it was armed";
    if (e.seen_at - e.expiration_time >= 0.05) {
      text << " (acted on " << std::setprecision(2) << e.seen_at - e.expiration_time
           << " s after its expiry)";
    }
    text << "; cpprun sent " << signalName(e.signal) << " to pid " << e.pid;
    if (e.pid != w.pid) text << " (a descendant of the worker)";
    if (!e.kill_error.empty()) text << ", which failed: " << e.kill_error;
    if (e.scopes.size() > 1) {
      text << "; expired with it:";
      for (const std::string& scope : e.scopes) {
        if (scope != e.scope_id) text << " '" << scope << "'";
      }
    }
    const std::string message = text.str();
    const auto expired_at =
        SystemClock::time_point(std::chrono::duration_cast<SystemClock::duration>(
            std::chrono::duration<double>(e.expiration_time)));
    w.timer_expiry = std::make_pair(message, expired_at);
    attempt_failed_ = true;
    CPPRUN_LOG(kError) << "rank " << w.spec.rank << " (pid " << w.pid << "): " << message
                       << "; stopping the workers";
    emitEvent(options_.event_log, "file_timer_expired",
              {{"attempt", restart_count_},
               {"rank", w.spec.rank},
               {"local_rank", w.spec.local_rank},
               {"pid", e.pid},
               {"worker_pid", w.pid},
               {"scope_id", e.scope_id},
               {"signal", signalName(e.signal)},
               {"armed_at", e.armed_at},
               {"expiration_time", e.expiration_time},
               {"message", message}});
    announce("rank " + std::to_string(w.spec.rank) + ": FileTimer scope '" + e.scope_id +
             "' expired");
    beginStop(SIGTERM);
  }

  // The directory of this attempt's automatic progress module (agent/python_progress.h), or ""
  // when stamps are off for it (no stall detection, --python-progress off, no log directory, or
  // the module could not be written: stamps never stop a job from starting).
  std::string preparePythonProgress(const std::string& attempt_dir) {
    if (!watchdog_.stallDetectionOn() || !options_.stall.python_progress || attempt_dir.empty()) {
      return "";
    }
    const std::string dir = attempt_dir + "/python";
    Status written = writePythonProgressModule(dir);
    if (!written.isOk()) {
      CPPRUN_LOG(kWarn) << "automatic progress stamps are off for this attempt: "
                        << written.message();
      return "";
    }
    return dir;
  }

  // --duplicate-std{out,err}-filters: this attempt's filtered_std{out,err}.log, shared by its
  // workers' tee'd streams (the previous attempt's close once its streams are done).
  Status openFilteredCopies(const std::string& attempt_dir) {
    filtered_out_.reset();
    filtered_err_.reset();
    if (attempt_dir.empty()) return Status::ok();
    const std::pair<const std::vector<std::string>*, std::shared_ptr<FilteredCopy>*> copies[] = {
        {&options_.output.duplicate_stdout_filters, &filtered_out_},
        {&options_.output.duplicate_stderr_filters, &filtered_err_}};
    const char* names[] = {"/filtered_stdout.log", "/filtered_stderr.log"};
    for (size_t i = 0; i < 2; ++i) {
      if (copies[i].first->empty()) continue;
      std::error_code ec;
      std::filesystem::create_directories(attempt_dir, ec);
      auto copy = FilteredCopy::create(attempt_dir + names[i], *copies[i].first, sinks_);
      if (!copy.isOk()) return copy.status();
      *copies[i].second = std::move(copy).value();
    }
    return Status::ok();
  }

  Status startWorker(size_t index, const std::string& attempt_dir) {
    Worker& w = workers_[index];
    std::string rank_dir =
        attempt_dir.empty() ? "" : attempt_dir + "/" + std::to_string(w.spec.local_rank);
    WorkerOutputPlan plan =
        planWorkerOutput(options_.output, w.spec.local_rank, w.spec.rank, rank_dir);
    if (plan.out.filterable) plan.out.filtered = filtered_out_;
    if (plan.err.filterable) plan.err.filtered = filtered_err_;
    if (!rank_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(rank_dir, ec);
      if (ec)
        return invalidArgument("cannot create log directory " + rank_dir + ": " + ec.message());
    }
    StreamEnds out_ends;
    StreamEnds err_ends;
    if (Status s = openStream(plan.out, out_ends); !s.isOk()) return s;
    if (Status s = openStream(plan.err, err_ends); !s.isOk()) {
      ::close(out_ends.read);
      ::close(out_ends.write);
      return s;
    }
    auto eof = [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->maybeFinishDrain();
    };
    auto out = WorkerOutput::create(io_, out_ends.read, plan.out, 0, eof, sinks_);
    auto err = WorkerOutput::create(io_, err_ends.read, plan.err, options_.output.stderr_tail_lines,
                                    eof, sinks_);
    ProcessSpec spec;
    spec.argv = w.spec.argv;
    spec.env = w.spec.env;
    if (file_timer_) spec.env["TORCHELASTIC_TIMER_FILE"] = file_timer_->path();
    if (!rank_dir.empty()) {
      spec.env[kProgressFileVariable] = StallWatchdog::progressFile(rank_dir);
      spec.env["CPPRUN_STACK_FILE"] = StallWatchdog::stackFile(rank_dir);
      if (!python_progress_dir_.empty()) {
        addPythonProgress(spec.env, python_progress_dir_,
                          pythonProgressInterval(options_.stall.timeout),
                          std::getenv("PYTHONPATH"));
      }
    }
    spec.stdout_fd = out_ends.write;
    spec.stderr_fd = err_ends.write;
    // The stdout pty (else the stderr one) is its controlling terminal (worker_terminal.h).
    spec.controlling_tty_fd = plan.out.pty ? out_ends.write : (plan.err.pty ? err_ends.write : -1);
    // cpprun's stdin (stdin_forwarder.h): its stdout pty when cpprun's stdin is a terminal,
    // else a descriptor the forwarder gives; /dev/null for everyone else.
    StdinForwarder* forwarder = options_.stdin_forwarder;
    const bool stdin_wanted = forwarder != nullptr && forwarder->wants(w.spec.rank);
    const bool stdin_is_pty = stdin_wanted && plan.out.pty && forwarder->sourceIsTerminal();
    int stdin_fd = -1;
    if (stdin_is_pty) {
      spec.stdin_fd = out_ends.write;
    } else if (stdin_wanted) {
      auto given = forwarder->descriptorForWorker();
      if (given.isOk()) {
        stdin_fd = given.value();
        spec.stdin_fd = stdin_fd;
      } else {
        CPPRUN_LOG(kWarn) << "rank " << w.spec.rank
                          << " reads /dev/null: " << given.status().message();
      }
    }
    spec.cpus = w.spec.cpus;  // --numa-binding (empty: inherit)
    spec.memory_policy = w.spec.memory_policy;
    spec.memory_nodes = w.spec.memory_nodes;
    Result<pid_t> pid = (out.isOk() && err.isOk())
                            ? launcher_.spawn(spec)
                            : Result<pid_t>(!out.isOk() ? out.status() : err.status());
    ::close(out_ends.write);
    ::close(err_ends.write);
    if (stdin_fd >= 0) ::close(stdin_fd);
    if (!pid.isOk()) {
      return Status(pid.status().code(),
                    "rank " + std::to_string(w.spec.rank) + ": " + pid.status().message());
    }
    if (stdin_is_pty) forwarder->addTerminal(out_ends.read, /*echo=*/w.spec.rank == 0);
    w.pid = pid.value();
    watchdog_.workerStarted(index, {w.spec.rank, w.spec.local_rank, w.pid, rank_dir});
    ++workers_started_;
    nlohmann::json started = {{"attempt", restart_count_},
                              {"rank", w.spec.rank},
                              {"local_rank", w.spec.local_rank},
                              {"pid", w.pid},
                              {"program", w.spec.argv.empty() ? "" : w.spec.argv.front()}};
    if (!w.spec.binding.empty()) started["numa_binding"] = w.spec.binding;
    emitEvent(options_.event_log, "worker_started", started);
    w.out = std::move(out).value();
    w.err = std::move(err).value();
    w.out->start();
    w.err->start();
    return Status::ok();
  }

  void onChildExit(pid_t pid, int status) {
    if (watchdog_.onChildExit(pid, status)) return;  // a gdb collecting stacks
    Worker* w = find(pid);
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
    if (state_ == State::kRunning && !succeeded(status)) {
      CPPRUN_LOG(kError) << "rank " << w->spec.rank << " (local_rank " << w->spec.local_rank
                         << ", pid " << pid << ") " << describeStatus(status)
                         << "; stopping the other workers";
      attempt_failed_ = true;
      announce("rank " + std::to_string(w->spec.rank) + " " + describeStatus(status));
      beginStop(SIGTERM);
      return;
    }
    if (state_ == State::kStopping || !succeeded(status)) {
      CPPRUN_LOG(kInfo) << "rank " << w->spec.rank << " (pid " << pid << ") "
                        << describeStatus(status);
    }
    if (allExited() && (state_ == State::kRunning || state_ == State::kStopping)) beginDrain();
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
        signalWorkers(signo);  // the user insists: pass it on again
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

  void onPeerStop(int n, const std::string& reason, int signo) {
    if (state_ == State::kIdle && options_.coordinator != nullptr) {
      // The attempt's start is on its way (the stop and the start are posted from different
      // threads of the coordinator): act on it once the workers are up.
      early_peer_stop_ = PeerStopNote{n, reason, signo};
      return;
    }
    if (n != restart_count_ || state_ != State::kRunning) return;
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
    stop_signal_ = signo;
    signalWorkers(signo);
    // A stopped worker (SIGSTOP, a debugger) cannot act on SIGTERM: wake it to receive it.
    if (signo == SIGTERM) signalWorkers(SIGCONT);
    if (allExited()) {
      beginDrain();
      return;
    }
    stop_began_ = SteadyClock::now();
    stop_notice_ = WaitNotice(stop_began_);
    armStopNotice();
    if (signo == SIGKILL) {
      sent_kill_ = true;
      armReapTimer();
      return;
    }
    stop_timer_.expires_after(options_.shutdown_timeout);
    stop_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || self->state_ != State::kStopping) return;
      self->onStopTimeout();
    });
  }  // While a teardown waits, say on what (bounded in volume by WaitNotice).
  void armStopNotice() {
    notice_timer_.expires_at(stop_notice_.next());
    notice_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || self->state_ != State::kStopping) return;
      const auto now = SteadyClock::now();
      if (self->stop_notice_.due(now)) self->announceStopWait(now);
      self->armStopNotice();
    });
  }

  void announceStopWait(SteadyClock::time_point now) {
    std::string ranks;
    int left = 0;
    for (const Worker& w : workers_) {
      if (w.exited) continue;
      ++left;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.spec.rank);
    }
    const auto waited = sinceMs(stop_began_, now);
    std::string text = "waiting for " + std::to_string(left) + " of " +
                       std::to_string(workers_.size()) + " workers (ranks " + ranks +
                       ") to exit after " + signalName(stop_signal_) + " for " + formatWait(waited);
    if (!sent_kill_) {
      text += ", SIGKILL in " + formatWait(options_.shutdown_timeout - waited);
    } else {
      text +=
          "; SIGKILL sent (a process in uninterruptible sleep waits for the kernel; given up "
          "on " +
          formatWait(options_.reap_timeout) + " after SIGKILL)";
    }
    CPPRUN_LOG(kWarn) << text;
  }

  void onStopTimeout() {
    sent_kill_ = true;
    std::string ranks;
    for (const Worker& w : workers_) {
      if (!w.exited) ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.spec.rank);
    }
    CPPRUN_LOG(kWarn) << "ranks " << ranks << " still running "
                      << options_.shutdown_timeout.count() / 1000.0 << " s after "
                      << signalName(stop_signal_) << "; sending SIGKILL";
    signalWorkers(SIGKILL);
    armReapTimer();
  }

  // The reap bound: a worker SIGKILL has not ended by then is given up on (onReapTimeout).
  void armReapTimer() {
    kill_sent_at_ = SteadyClock::now();
    reap_rechecked_ = false;
    reap_timer_.expires_after(options_.reap_timeout);
    reap_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || self->state_ != State::kStopping) return;
      self->onReapTimeout();
    });
  }

  // Everything killable has had SIGKILL; what is still alive cannot be waited for without a
  // bound. Name it (pid, state, wchan, stack) and go on without it: the job ends with exit 7.
  void onReapTimeout() {
    const double waited = std::chrono::duration<double>(SteadyClock::now() - kill_sent_at_).count();
    bool reaping = false;
    for (Worker& w : workers_) {
      if (w.exited || w.pid <= 0) continue;
      const char state = launcher_.stateOf(w.pid);
      if ((state == 0 || state == 'Z') && !reap_rechecked_) {
        reaping = true;  // dead, its SIGCHLD not handled yet: the reaper is about to report it
        continue;
      }
      w.unreaped = true;
      w.unreaped_as = inspectProcess(w.pid);
      if (w.unreaped_as.state == 0) w.unreaped_as.state = state;
      w.exited = true;
      w.exited_during_stop = true;
      w.exit_time = SystemClock::now();
      watchdog_.workerExited(static_cast<size_t>(&w - workers_.data()));
      unreaped_ = true;
      nlohmann::json left = nlohmann::json::array();
      std::string left_text;
      for (pid_t pid : descendantsOf(w.pid)) {
        StuckProcess p = inspectProcess(pid);
        if (p.state == 0 || p.state == 'Z') continue;
        left.push_back(stuckToJson(p));
        left_text += "; " + describeStuck(p);
      }
      CPPRUN_LOG(kError) << "rank " << w.spec.rank << ": " << describeStuck(w.unreaped_as)
                         << " still alive " << formatWait(options_.reap_timeout)
                         << " after SIGKILL; giving up on it (exit 7)" << left_text;
      for (const std::string& frame : w.unreaped_as.stack) {
        CPPRUN_LOG(kError) << "  pid " << w.pid << " kernel stack: " << frame;
      }
      emitEvent(options_.event_log, "worker_unreaped",
                {{"attempt", restart_count_},
                 {"rank", w.spec.rank},
                 {"local_rank", w.spec.local_rank},
                 {"pid", w.pid},
                 {"seconds_after_sigkill", waited},
                 {"reap_timeout_s", options_.reap_timeout.count() / 1000.0},
                 {"process", stuckToJson(w.unreaped_as)},
                 {"group_left", left}});
      // Its pipes stay open as long as it lives: take what is there and stop reading.
      if (w.out) w.out->close();
      if (w.err) w.err->close();
    }
    if (reaping) {
      // Once: a process that is gone is reaped by the next turn of the loop.
      reap_rechecked_ = true;
      reap_timer_.expires_after(kReapRecheck);
      reap_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
        auto self = weak.lock();
        if (!self || ec || self->state_ != State::kStopping) return;
        self->onReapTimeout();
      });
      return;
    }
    if (allExited()) beginDrain();
  }

  void signalWorkers(int signo) {
    for (const Worker& w : workers_) {
      if (w.pid <= 0) continue;
      if (Status s = launcher_.signalWorker(w.pid, !w.exited, signo); !s.isOk()) {
        CPPRUN_LOG(kWarn) << s.message();
      }
    }
  }

  void beginDrain() {
    setState(State::kDraining);
    // Every worker has exited: input read from now on waits for the next attempt's.
    if (options_.stdin_forwarder != nullptr) options_.stdin_forwarder->clearWorkers();
    stop_timer_.cancel();
    notice_timer_.cancel();
    reap_timer_.cancel();
    sent_kill_ = false;
    // Whatever is left in the workers' groups (grandchildren) and whatever double-forked out of
    // them and was re-parented to us goes now, so the pipes reach EOF.
    signalWorkers(SIGKILL);
    std::vector<pid_t> given_up;  // still the agent's children, not orphans
    for (const Worker& w : workers_) {
      if (w.unreaped) given_up.push_back(w.pid);
    }
    size_t orphans = launcher_.killAdoptedOrphans(given_up);
    if (orphans > 0) {
      CPPRUN_LOG(kInfo) << "killed " << orphans << " process(es) left behind by the workers";
    }
    drain_timer_.expires_after(options_.drain_timeout);
    drain_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || self->state_ != State::kDraining) return;
      CPPRUN_LOG(kWarn) << "worker output still open " << self->options_.drain_timeout.count()
                        << " ms after the workers exited; closing it";
      for (Worker& w : self->workers_) {
        if (w.out) w.out->close();
        if (w.err) w.err->close();
      }
    });
    maybeFinishDrain();
  }

  void maybeFinishDrain() {
    if (state_ != State::kDraining) return;
    for (const Worker& w : workers_) {
      if ((w.out && !w.out->atEof()) || (w.err && !w.err->atEof())) return;
    }
    drain_timer_.cancel();
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

  void finishAttempt() {
    failures_ = collectFailures();
    for (const WorkerFailure& f : failures_) {
      if (f.teardown) continue;
      ++worker_failures_;
      emitEvent(options_.event_log, "failure", failureEvent(f));
    }
    if (options_.coordinator != nullptr && lost_error_.isOk()) {
      endAttemptWithPeers();
      return;
    }
    // A wedged worker holds what a new group would need (its GPU): no restart.
    const bool wedged = unreaped_ || no_restart_;
    const AttemptVerdict verdict =
        decideAttempt(facts(), !wedged && restart_count_ < options_.max_restarts);
    if (verdict.restart) {
      ++restart_count_;
      CPPRUN_LOG(kWarn) << "worker group failed; restarting it (restart " << restart_count_
                        << " of " << options_.max_restarts << ")";
      emitEvent(options_.event_log, "restart",
                {{"restart", restart_count_}, {"max_restarts", options_.max_restarts}});
      startAttempt();
      return;
    }
    if (verdict.end == AttemptEnd::kWorkersFailed && wedged) {
      CPPRUN_LOG(kError) << "worker group failed with a worker "
                         << (unreaped_ ? "that SIGKILL did not end" : "in uninterruptible sleep")
                         << "; not restarting it";
    } else if (verdict.end == AttemptEnd::kWorkersFailed && options_.max_restarts > 0) {
      CPPRUN_LOG(kError) << "worker group failed and all " << options_.max_restarts
                         << " restarts are used";
    }
    finishJob();
  }

  // Multi-node: tell the others how this node's attempt ended; act on the job's decision.
  void endAttemptWithPeers() {
    AttemptReport report;
    report.failures = failures_;
    // The restart is the job's decision (the host's), not this node's.
    switch (decideAttempt(facts(), /*restart_left=*/false).end) {
      case AttemptEnd::kStartFailed:
        report.kind = AttemptReport::Kind::kStartFailed;
        report.error = start_error_.message();
        break;
      case AttemptEnd::kSignalled:
        report.kind = AttemptReport::Kind::kSignalled;
        report.signal = received_signal_;
        break;
      case AttemptEnd::kLostPeers:  // not here: finishAttempt ends the job instead
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
    switch (d.kind) {
      case JobDecision::Kind::kRestart:
        if (leaving_) break;  // the others re-form without this node
        // A wedged worker holds this node's GPU: it cannot take part in the next attempt.
        if (unreaped_ || no_restart_) break;
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
        failures_ = d.failures;
        if (!start_error_.isOk()) start_error_ = Status::ok();  // reported as a failure
        break;
      case JobDecision::Kind::kStopped:
        if (received_signal_ == 0) received_signal_ = d.signal;
        break;
    }
    finishJob();
  }

  std::vector<WorkerFailure> collectFailures() const {
    std::vector<WorkerFailure> failures;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Worker& w = workers_[i];
      if (w.unreaped) {
        failures.push_back(unreapedFailure(w));
        continue;
      }
      if (!w.exited || w.pid <= 0 || succeeded(w.status)) continue;
      bool stopped_by_us = w.exited_during_stop && WIFSIGNALED(w.status) &&
                           (WTERMSIG(w.status) == stop_signal_ || WTERMSIG(w.status) == SIGKILL);
      auto it = w.spec.env.find("TORCHELASTIC_ERROR_FILE");
      std::string error_file = it == w.spec.env.end() ? "" : it->second;
      failures.push_back(
          describeFailure(w.spec.local_rank, w.spec.rank, w.pid, w.status, w.exit_time, error_file,
                          w.err ? w.err->tail() : std::vector<std::string>{}, stopped_by_us));
      // Order by when the agent saw each exit (SIGCHLD, sub-millisecond), not by an error
      // file's whole-second timestamp, so the first failure really is the root cause.
      failures.back().time = w.exit_time;
      if (const WorkerProgress& p = watchdog_.worker(i); p.stalled) {
        // The agent ended it, but the stall is the failure: the root cause, with its stacks.
        WorkerFailure& f = failures.back();
        f.teardown = false;
        f.message = p.stall_message;
        f.traceback = p.stall_message + "\n";
        for (const std::string& line : p.stack_excerpt) f.traceback += line + "\n";
        f.time = p.stall_time;
      } else if (w.timer_expiry) {
        // Killed for an expired FileTimer scope: the scope is the failure.
        WorkerFailure& f = failures.back();
        f.teardown = false;
        f.message = w.timer_expiry->first;
        f.traceback = w.timer_expiry->first + "\n";
        f.time = w.timer_expiry->second;
      }
      if (w.d_timed_out) {
        // Ended by the agent, but the uninterruptible sleep is the failure.
        WorkerFailure& f = failures.back();
        f.teardown = false;
        f.message = w.d_message;
        f.traceback = w.d_message + "\n" + kernelStackText(w.pid, w.d_stack);
        f.time = w.d_time;
      }
    }
    return failures;
  }

  WorkerFailure unreapedFailure(const Worker& w) const {
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
    auto it = w.spec.env.find("TORCHELASTIC_ERROR_FILE");
    if (it != w.spec.env.end()) f.error_file = it->second;
    f.message = describeStuck(w.unreaped_as) + ": still alive " +
                formatWait(options_.reap_timeout) +
                " after SIGKILL (--reap-timeout); cpprun gave up on it";
    if (w.d_timed_out) f.message = w.d_message + "\n" + f.message;
    f.traceback = f.message + "\n" + kernelStackText(w.pid, w.unreaped_as.stack);
    return f;
  }

  static std::string kernelStackText(pid_t pid, const std::vector<std::string>& stack) {
    if (stack.empty()) return "";
    std::string text = "kernel stack (/proc/" + std::to_string(pid) + "/stack):\n";
    for (const std::string& frame : stack) text += "  " + frame + "\n";
    return text;
  }

  void finishJob() {
    setState(State::kDone);
    if (file_timer_) file_timer_->close();  // the pipe goes with the job
    stop_timer_.cancel();
    drain_timer_.cancel();
    reap_timer_.cancel();
    JobOutcome outcome;
    outcome.restarts = restart_count_;
    outcome.failures = failures_;
    outcome.summary = summary_;
    switch (decideAttempt(facts(), /*restart_left=*/false).end) {
      case AttemptEnd::kLostPeers:
        outcome.kind = JobOutcome::Kind::kLostPeers;
        outcome.error = lost_error_;
        break;
      case AttemptEnd::kStartFailed:
        outcome.kind = JobOutcome::Kind::kStartFailed;
        outcome.error = start_error_;
        break;
      case AttemptEnd::kSignalled:
        outcome.kind = JobOutcome::Kind::kSignalled;
        outcome.signal = received_signal_;
        break;
      case AttemptEnd::kWorkersFailed:
        outcome.kind = JobOutcome::Kind::kWorkersFailed;
        break;
      case AttemptEnd::kStoppedByPeer:  // the job's decision said how it ended: not a failure
      case AttemptEnd::kSucceeded:
        outcome.kind = JobOutcome::Kind::kSucceeded;
        break;
    }
    if (outcome.kind == JobOutcome::Kind::kSucceeded && leaving_) {
      outcome.kind = JobOutcome::Kind::kLeft;
    } else if (outcome.kind == JobOutcome::Kind::kSucceeded && not_needed_) {
      outcome.kind = JobOutcome::Kind::kNotNeeded;
    }
    if (options_.amend_outcome) options_.amend_outcome(outcome);
    // Whatever else happened, a process is left that nothing can kill: the node needs a look.
    if (unreaped_) outcome.kind = JobOutcome::Kind::kUnreaped;
    emitJobEvents(outcome);
    if (on_done_) on_done_(outcome);
  }
  static nlohmann::json failureEvent(const WorkerFailure& f) {
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
    if (f.unreaped) {
      fields["unreaped"] = true;
      fields["state"] = f.state == 0 ? std::string() : std::string(1, f.state);
      fields["wchan"] = f.wchan;
    }
    return fields;
  }

  void emitJobEvents(const JobOutcome& outcome) {
    if (options_.event_log == nullptr) return;
    if (!outcome.failures.empty() && (outcome.kind == JobOutcome::Kind::kWorkersFailed ||
                                      outcome.kind == JobOutcome::Kind::kUnreaped)) {
      nlohmann::json root = failureEvent(outcome.failures[rootCauseIndex(outcome.failures)]);
      if (!outcome.summary.empty()) root["summary"] = outcome.summary;
      options_.event_log->emit("root_cause", root);
    }
    nlohmann::json fields = {{"outcome", jobOutcomeName(outcome.kind)},
                             {"exit_code", outcome.exitCode()},
                             {"restarts", outcome.restarts}};
    if (!outcome.error.isOk()) fields["error"] = outcome.error.message();
    if (outcome.signal != 0) fields["signal"] = signalName(outcome.signal);
    options_.event_log->emit("job_finished", fields);
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
      const Worker& w = workers_[i];
      const WorkerProgress& p = watchdog_.worker(i);
      WorkerSnapshot ws;
      ws.rank = w.spec.rank;
      ws.local_rank = w.spec.local_rank;
      ws.numa_binding = w.spec.binding;
      ws.pid = w.pid;
      ws.alive = w.pid > 0 && !w.exited;
      if (w.exited && WIFSIGNALED(w.status)) ws.signal = WTERMSIG(w.status);
      if (w.exited && WIFEXITED(w.status)) ws.exit_code = WEXITSTATUS(w.status);
      ws.progress = p.progress;
      ws.seconds_since_progress =
          w.pid > 0 ? std::chrono::duration<double>(now - p.last_progress).count() : 0;
      ws.stalled = p.stalled;
      ws.stdout_bytes = w.out ? w.out->bytesRead() : 0;
      ws.stderr_bytes = w.err ? w.err->bytesRead() : 0;
      snap.output_bytes_total += ws.stdout_bytes + ws.stderr_bytes;
      snap.workers.push_back(ws);
    }
    snap.workers_started_total = workers_started_;
    snap.worker_failures_total = worker_failures_;
    snap.stalls_total = watchdog_.stallsTotal();
    return snap;
  }

  Worker* find(pid_t pid) {
    for (Worker& w : workers_) {
      if (w.pid == pid && !w.exited) return &w;
    }
    return nullptr;
  }

  bool allExited() const {
    for (const Worker& w : workers_) {
      if (!w.exited) return false;
    }
    return true;
  }

  asio::io_context& io_;
  ProcessLauncher& launcher_;
  SupervisorOptions options_;
  std::shared_ptr<OutputSinks> sinks_;
  // This attempt's --duplicate-std{out,err}-filters files; null without filters.
  std::shared_ptr<FilteredCopy> filtered_out_;
  std::shared_ptr<FilteredCopy> filtered_err_;
  PrepareAttempt prepare_;
  OnDone on_done_;
  asio::steady_timer stop_timer_;
  asio::steady_timer drain_timer_;
  asio::steady_timer notice_timer_;
  asio::steady_timer dstate_timer_;  // uninterruptible-sleep checks while the attempt runs
  asio::steady_timer reap_timer_;    // the reap bound after SIGKILL
  StallWatchdog watchdog_;
  std::unique_ptr<FileTimerServer> file_timer_;  // TORCHELASTIC_ENABLE_FILE_TIMER=1 only
  SteadyClock::time_point state_since_;
  std::map<State, double> state_seconds_;
  SteadyClock::time_point stop_began_;
  WaitNotice stop_notice_{SteadyClock::now()};
  bool sent_kill_ = false;
  bool warned_pty_ = false;
  SteadyClock::time_point kill_sent_at_;
  bool reap_rechecked_ = false;
  bool unreaped_ = false;    // a worker was given up on at the reap bound: exit 7
  bool no_restart_ = false;  // a worker stayed in uninterruptible sleep: no restart (torch)
  uint64_t output_bytes_before_ = 0;
  uint64_t workers_started_ = 0;
  uint64_t worker_failures_ = 0;
  State state_ = State::kIdle;
  int restart_count_ = 0;
  std::vector<Worker> workers_;
  std::vector<WorkerFailure> failures_;
  bool attempt_failed_ = false;
  bool peer_stopped_ = false;
  bool leaving_ = false;             // onLeave: this node leaves the job after this attempt
  bool not_needed_ = false;          // a spare that found the job over
  std::string python_progress_dir_;  // this attempt's, see preparePythonProgress
  struct PeerStopNote {
    int attempt;
    std::string reason;
    int signal;
  };
  std::optional<PeerStopNote> early_peer_stop_;  // a peer's stop that came before the start
  Status lost_error_;
  std::optional<AttemptStart> attempt_start_;
  std::string summary_;
  int stop_signal_ = 0;
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
void Supervisor::onWindowChange() { impl_->onWindowChange(); }
void Supervisor::onPeerStop(int restart_count, const std::string& reason, int signal) {
  impl_->onPeerStop(restart_count, reason, signal);
}
const std::optional<AttemptStart>& Supervisor::attemptStart() const {
  return impl_->attempt_start_;
}
void Supervisor::onCoordinatorLost(const Status& status) { impl_->onCoordinatorLost(status); }
void Supervisor::onLeave(const std::string& why) { impl_->onLeave(why); }
bool Supervisor::done() const { return impl_->state_ == Impl::State::kDone; }
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
