#include "agent/supervision/stall_watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "agent/supervision/stall_verdict.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/progress_file.h"
#include "common/wait_notice.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using SystemClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// After the helpers were SIGKILLed at the stack bound: how long their exits may take to be seen.
constexpr milliseconds kKilledHelperGrace{200};

// Up to `max_bytes` of `path` from `offset` ("" when it cannot be read).
std::string readFileFrom(const std::string& path, uint64_t offset, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  std::string text(max_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(max_bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

uint64_t fileSize(const std::string& path) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(size);
}

// The lines of a stack dump worth showing in a report: gdb's thread headers and frames, or
// faulthandler's thread headers and "File ..." lines; at most `max_lines`.
std::vector<std::string> stackLines(const std::string& text, size_t max_lines) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line) && lines.size() < max_lines) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    const std::string body = line.substr(start);
    if (body.rfind("Thread ", 0) == 0 || body.rfind("Current thread", 0) == 0 ||
        body.rfind("File \"", 0) == 0 ||
        (body[0] == '#' && body.size() > 1 && std::isdigit(static_cast<unsigned char>(body[1])))) {
      lines.push_back(line);
    }
  }
  return lines;
}

}  // namespace

class StallWatchdog::Impl : public std::enable_shared_from_this<StallWatchdog::Impl> {
 public:
  struct Watched {
    Worker worker;
    bool exited = false;
    std::string progress_path;
    std::string stack_path;
    std::string collective_path;
    std::string collective_text;  // its record when the collection began
    int64_t last_mtime_ns = -1;
    uint64_t python_stack_offset = 0;
    bool python_stack_requested = false;
    std::string gdb_output_path;
    WorkerProgress state;
  };

  Impl(asio::io_context& io, ProcessLauncher& launcher, StallOptions options, bool track_progress,
       EventLog* event_log, Callbacks callbacks)
      : launcher_(launcher),
        options_(std::move(options)),
        track_progress_(track_progress),
        event_log_(event_log),
        callbacks_(std::move(callbacks)),
        progress_timer_(io),
        stack_timer_(io) {}

  bool stallDetectionOn() const { return options_.timeout.count() > 0; }
  bool progressOn() const { return stallDetectionOn() || track_progress_; }

  milliseconds progressInterval() const {
    if (options_.check_interval.count() > 0) return options_.check_interval;
    if (!stallDetectionOn()) return milliseconds(1000);
    return std::clamp(options_.timeout / 10, milliseconds(10), milliseconds(250));
  }

  milliseconds firstTimeout() const {
    return options_.first_timeout.count() > 0 ? options_.first_timeout : options_.timeout;
  }
  // A worker that ended its program and is exiting (agent/supervision/python_progress.h's marker)
  // is bounded like a starting one. Looked at only when the shorter bound has passed.
  static bool exiting(const Watched& w) {
    std::error_code ec;
    return std::filesystem::exists(w.progress_path + ".exiting", ec);
  }
  // Whether `w` has gone without progress for longer than the bound that applies to it.
  bool pastBound(const Watched& w, SteadyClock::time_point now) const {
    const auto quiet = now - w.state.last_progress;
    if (!w.state.reported) return quiet >= firstTimeout();
    return quiet >= options_.timeout && (quiet >= firstTimeout() || !exiting(w));
  }

  void beginAttempt(int attempt, size_t worker_count) {
    stopChecks();
    attempt_ = attempt;
    workers_.clear();
    workers_.resize(worker_count);
    collecting_stacks_ = false;
    ++stall_generation_;
    stack_timer_.cancel();
    states_.clear();
    // A collection of the last attempt asked for by a peer's stop: answered now, with nothing.
    runWaiters();
  }

  void workerStarted(size_t index, const Worker& worker) {
    Watched& w = workers_.at(index);
    w.worker = worker;
    if (!worker.rank_dir.empty()) {
      w.progress_path = progressFile(worker.rank_dir);
      w.stack_path = stackFile(worker.rank_dir);
      w.collective_path = collectiveFile(worker.rank_dir);
    }
    w.state.started = true;
    w.state.last_progress = SteadyClock::now();
  }

  void workerExited(size_t index) { workers_.at(index).exited = true; }

  bool watched(const Watched& w) const {
    return w.state.started && !w.exited && w.worker.pid > 0 && !w.state.stalled &&
           !w.progress_path.empty();
  }

  void startChecks() {
    if (!progressOn()) return;
    checking_ = true;
    armProgressTimer();
  }

  void stopChecks() {
    checking_ = false;
    progress_timer_.cancel();
  }

  void armProgressTimer() {
    progress_timer_.expires_after(progressInterval());
    progress_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || !self->checking_) return;
      self->checkProgress();
      if (self->checking_) self->armProgressTimer();
    });
  }

  // Reads every watched worker's progress file; a changed file is progress at `now`.
  void refreshProgress(SteadyClock::time_point now) {
    for (Watched& w : workers_) {
      if (!watched(w)) continue;
      if (auto sample = readProgress(w.progress_path)) {
        if (sample->mtime_ns != w.last_mtime_ns) {
          w.last_mtime_ns = sample->mtime_ns;
          w.state.last_progress = now;
          w.state.reported = true;
          if (sample->counter) w.state.progress = sample->counter;
        }
      }
    }
  }

  void checkProgress() {
    const auto now = SteadyClock::now();
    refreshProgress(now);
    if (!stallDetectionOn() || collecting_stacks_) return;
    std::vector<size_t> stalled;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Watched& w = workers_[i];
      if (watched(w) && pastBound(w, now)) stalled.push_back(i);
    }
    if (!stalled.empty()) onStall(stalled, now);
  }

  std::string describeStall(const Watched& w, SteadyClock::time_point now) const {
    const WorkerProgress& p = w.state;
    std::string last = p.progress ? "last progress report: " + std::to_string(*p.progress)
                       : w.last_mtime_ns >= 0 ? std::string("its reports carry no counter")
                                              : std::string("it never reported progress");
    const bool finishing = p.reported && exiting(w);
    const std::string bound = p.reported && !finishing
                                  ? "--stall-timeout " + formatWait(options_.timeout)
                                  : "--stall-first-timeout " + formatWait(firstTimeout());
    const char* what = !p.reported ? "stalled: no first progress in "
                       : finishing
                           ? "stalled while exiting after its program ended: no progress for "
                           : "stalled: no progress for ";
    return std::string(what) +
           formatWait(std::chrono::duration_cast<milliseconds>(now - p.last_progress)) + " (" +
           bound + "; " + last + ")";
  }

  bool stacksOn() const { return options_.stacks_timeout.count() > 0; }

  void onStall(const std::vector<size_t>& indices, SteadyClock::time_point now) {
    for (size_t i : indices) {
      Watched& w = workers_[i];
      ++stalls_total_;
      w.state.stalled = true;
      w.state.stall_time = SystemClock::now();
      w.state.stall_message = describeStall(w, now);
      CPPRUN_LOG(kError) << "rank " << w.worker.rank << " (local_rank " << w.worker.local_rank
                         << ", pid " << w.worker.pid << ") is " << w.state.stall_message
                         << "; collecting the state of every rank into their directories";
      emitEvent(
          event_log_, "stall_detected",
          {{"attempt", attempt_},
           {"rank", w.worker.rank},
           {"local_rank", w.worker.local_rank},
           {"pid", w.worker.pid},
           {"seconds_since_progress",
            std::chrono::duration<double>(now - w.state.last_progress).count()},
           {"progress", w.state.progress ? nlohmann::json(*w.state.progress) : nlohmann::json()}});
    }
    beginCollection(indices, /*local_stall=*/true, now);
  }

  // A snapshot of every rank: SIGUSR1 to each running Python worker (its stacks), gdb for the
  // stalled ranks that have no Python stacks, then the states (finishStall). `stalled`: the
  // ranks this node found stalled (empty when a peer's stall asked for the snapshot).
  void beginCollection(const std::vector<size_t>& stalled, bool local_stall,
                       SteadyClock::time_point now) {
    collecting_stacks_ = true;
    local_stall_ = local_stall;
    stall_deadline_ = now + options_.stacks_timeout;
    ++stall_generation_;
    collection_pending_ = 0;
    stall_indices_ = stalled;
    bool any_python = false;
    for (Watched& w : workers_) {
      w.python_stack_requested = false;
      w.gdb_output_path.clear();
      // The records first, at once: a peer's teardown soon ends the collectives the ranks wait in.
      w.collective_text = w.collective_path.empty() ? "" : readFileFrom(w.collective_path, 0, 256);
      // Python stacks: only a worker whose helper registered faulthandler on SIGUSR1 (it
      // created the stack file) gets the signal; to any other, SIGUSR1 may mean "stop".
      if (!stacksOn() || !w.state.started || w.exited || w.worker.pid <= 0 ||
          w.stack_path.empty() || !std::filesystem::exists(w.stack_path)) {
        continue;
      }
      w.python_stack_offset = fileSize(w.stack_path);
      w.python_stack_requested = true;
      Status sent = launcher_.signalProcess(w.worker.pid, SIGUSR1);
      if (sent.isOk()) {
        any_python = true;
      } else {
        w.python_stack_requested = false;
        CPPRUN_LOG(kWarn) << sent.message();
      }
    }
    // The states without stacks, at once: if the attempt ends before the stacks are in (a
    // worker failing as its peers are torn down), its report still carries every record.
    states_.clear();
    for (const Watched& w : workers_) {
      if (w.state.started) states_.push_back(stateOf(w, ""));
    }
    if (stacksOn() && options_.gdb_path.empty() && local_stall) {
      bool any_native = false;
      for (size_t i : stalled) any_native = any_native || !workers_[i].python_stack_requested;
      if (any_native) {
        CPPRUN_LOG(kWarn) << "gdb not found: no native stacks of the stalled ranks";
      }
    }
    if (local_stall && callbacks_.on_stalled) callbacks_.on_stalled(stalled);
    const milliseconds grace = std::min(options_.faulthandler_grace, options_.stacks_timeout / 2);
    stack_timer_.expires_after(any_python ? grace : milliseconds(0));
    stack_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || !self->collecting_stacks_) return;
      self->startNativeStacks();
    });
  }

  // A peer's stall stopped the attempt: snapshot every rank, then `done` (at once when checks
  // never ran; joins a collection already in progress).
  void collectForPeer(std::function<void()> done) {
    waiters_.push_back(std::move(done));
    if (collecting_stacks_) return;
    if (!stallDetectionOn()) {
      runWaiters();
      return;
    }
    refreshProgress(SteadyClock::now());
    beginCollection({}, /*local_stall=*/false, SteadyClock::now());
  }

  void runWaiters() {
    auto waiters = std::move(waiters_);
    waiters_.clear();
    for (auto& done : waiters) done();
  }

  void startNativeStacks() {
    if (stacksOn() && !options_.gdb_path.empty()) {
      for (size_t i : stall_indices_) {
        Watched& w = workers_[i];
        // Python workers have their faulthandler stacks: gdb would not finish in the bound on
        // a torch process (it reads the symbols of hundreds of libraries), so it is left out.
        if (w.exited || w.worker.rank_dir.empty() || w.python_stack_requested) continue;
        w.gdb_output_path = w.worker.rank_dir + "/stacks_gdb.txt";
        const int fd = ::open(w.gdb_output_path.c_str(),
                              O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
          CPPRUN_LOG(kWarn) << "cannot write " << w.gdb_output_path << ": " << std::strerror(errno);
          w.gdb_output_path.clear();
          continue;
        }
        ProcessSpec gdb;
        gdb.argv = {options_.gdb_path,
                    "-nx",
                    "-batch",
                    "-p",
                    std::to_string(w.worker.pid),
                    "-ex",
                    "set pagination off",
                    "-ex",
                    "thread apply all bt"};
        gdb.stdout_fd = fd;
        gdb.stderr_fd = fd;
        auto pid = launcher_.spawn(gdb);
        ::close(fd);
        if (!pid.isOk()) {
          CPPRUN_LOG(kWarn) << "cannot run gdb: " << pid.status().message();
          continue;
        }
        ++collection_pending_;
        // A gdb of an earlier stall that exits late (killed with its attempt's leftovers)
        // must not count for this one.
        helpers_[pid.value()] = stall_generation_;
      }
    }
    if (collection_pending_ == 0) {
      finishStall();
      return;
    }
    // The collection is bounded from the stall: a gdb reading a large program's symbols, or
    // held by a worker in an uninterruptible state, is killed at the bound with what it wrote.
    stack_timer_.expires_at(stall_deadline_);
    stack_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || !self->collecting_stacks_) return;
      CPPRUN_LOG(kWarn) << "stack collection did not finish within "
                        << formatWait(self->options_.stacks_timeout)
                        << " (--stall-stacks-timeout); killing gdb";
      for (const auto& helper : self->helpers_) {
        (void)self->launcher_.signalGroup(helper.first, SIGKILL);
      }
      // A tracer killed while its tracee is stopped can leave it stopped, deaf to the SIGTERM
      // of the teardown that follows: let it run again.
      for (size_t i : self->stall_indices_) {
        const Watched& w = self->workers_[i];
        if (!w.exited && w.worker.pid > 0)
          (void)self->launcher_.signalProcess(w.worker.pid, SIGCONT);
      }
      // A gdb that SIGKILL cannot end at once (in an uninterruptible wait itself) is left to
      // the reaper: the stall is reported now, with whatever the files hold.
      self->stack_timer_.expires_after(kKilledHelperGrace);
      self->stack_timer_.async_wait([weak](const boost::system::error_code& ec2) {
        auto again = weak.lock();
        if (again && !ec2) again->finishStall();
      });
    });
  }

  bool onChildExit(pid_t pid) {
    auto helper = helpers_.find(pid);
    if (helper == helpers_.end()) return false;
    const uint64_t generation = helper->second;
    helpers_.erase(helper);
    if (generation == stall_generation_ && --collection_pending_ == 0) finishStall();
    return true;
  }

  // Every stack collection of the stall is over: build the excerpts and every rank's state,
  // log the stalled ranks' stacks, report.
  void finishStall() {
    if (!collecting_stacks_) return;
    collecting_stacks_ = false;
    stack_timer_.cancel();
    states_.clear();
    for (Watched& w : workers_) {
      if (!w.state.started) continue;
      const std::string python_text =
          w.python_stack_requested ? readFileFrom(w.stack_path, w.python_stack_offset, 256 * 1024)
                                   : std::string();
      states_.push_back(stateOf(w, python_text));
      // The full excerpt (every thread) only for the stalled ranks' own report lines.
      if (!w.state.stalled || !w.state.stack_excerpt.empty()) continue;
      buildExcerpt(w, stackLines(python_text, 60));
    }
    if (local_stall_ && callbacks_.on_collected) callbacks_.on_collected(stall_indices_);
    runWaiters();
  }

  RankState stateOf(const Watched& w, const std::string& python_text) const {
    RankState s;
    s.rank = w.worker.rank;
    s.local_rank = w.worker.local_rank;
    s.pid = w.worker.pid;
    s.stalled = w.state.stalled;
    s.exited = w.exited;
    if (auto record = parseCollectiveRecord(w.collective_text); record.isOk()) {
      s.collective = record.value();
    }
    s.stack = mainThreadStack(python_text);
    s.frame = innermostFrameOf(s.stack);
    return s;
  }

  void buildExcerpt(Watched& w, const std::vector<std::string>& python_lines) {
    std::vector<std::string>& excerpt = w.state.stack_excerpt;
    std::vector<std::string> files;
    if (!python_lines.empty()) {
      excerpt.push_back("Python stacks (faulthandler, " + w.stack_path + "):");
      excerpt.insert(excerpt.end(), python_lines.begin(), python_lines.end());
      files.push_back(w.stack_path);
    }
    if (!w.gdb_output_path.empty()) {
      auto lines = stackLines(readFileFrom(w.gdb_output_path, 0, 1024 * 1024), 80);
      if (!lines.empty()) {
        excerpt.push_back("native stacks (gdb, " + w.gdb_output_path + "):");
        excerpt.insert(excerpt.end(), lines.begin(), lines.end());
      } else {
        excerpt.push_back("gdb gave no stack (see " + w.gdb_output_path +
                          "; ptrace may be forbidden here)");
      }
      files.push_back(w.gdb_output_path);
    }
    if (excerpt.empty() && !stacksOn()) {
      excerpt.push_back("no stacks: --stall-stacks-timeout off");
    } else if (excerpt.empty()) {
      excerpt.push_back(
          "no stacks: gdb was not found and the worker registered no faulthandler "
          "(examples/python/cpprun_progress.py)");
    }
    CPPRUN_LOG(kError) << "rank " << w.worker.rank << " stacks:";
    for (const std::string& line : excerpt) CPPRUN_LOG(kError) << "  " << line;
    emitEvent(
        event_log_, "stall_stacks",
        {{"attempt", attempt_}, {"rank", w.worker.rank}, {"files", files}, {"stacks", excerpt}});
  }

  ProcessLauncher& launcher_;
  StallOptions options_;
  bool track_progress_;
  EventLog* event_log_;
  Callbacks callbacks_;
  asio::steady_timer progress_timer_;
  asio::steady_timer stack_timer_;
  int attempt_ = 0;
  std::vector<Watched> workers_;
  bool checking_ = false;
  // The stall being collected: its ranks, how many gdbs are still running, and its number
  // (the gdb helpers by pid remember theirs, so one of an older stall is ignored).
  bool collecting_stacks_ = false;
  SteadyClock::time_point stall_deadline_;
  std::vector<size_t> stall_indices_;
  int collection_pending_ = 0;
  uint64_t stall_generation_ = 0;
  std::map<pid_t, uint64_t> helpers_;
  uint64_t stalls_total_ = 0;
  bool local_stall_ = false;       // the collection is this node's stall (else a peer's)
  std::vector<RankState> states_;  // every rank's, from the last collection of the attempt
  std::vector<std::function<void()>> waiters_;  // collectForPeer's
};

StallWatchdog::StallWatchdog(asio::io_context& io, ProcessLauncher& launcher, StallOptions options,
                             bool track_progress, EventLog* event_log, Callbacks callbacks)
    : impl_(std::make_shared<Impl>(io, launcher, std::move(options), track_progress, event_log,
                                   std::move(callbacks))) {}

StallWatchdog::~StallWatchdog() = default;

std::string StallWatchdog::progressFile(const std::string& rank_dir) {
  return rank_dir + "/progress";
}
std::string StallWatchdog::stackFile(const std::string& rank_dir) {
  return rank_dir + "/python_stacks.txt";
}
std::string StallWatchdog::collectiveFile(const std::string& rank_dir) {
  return rank_dir + "/collective";
}
void StallWatchdog::collectForPeer(std::function<void()> done) {
  impl_->collectForPeer(std::move(done));
}
const std::vector<RankState>& StallWatchdog::rankStates() const { return impl_->states_; }

void StallWatchdog::beginAttempt(int attempt, size_t worker_count) {
  impl_->beginAttempt(attempt, worker_count);
}
void StallWatchdog::workerStarted(size_t index, const Worker& worker) {
  impl_->workerStarted(index, worker);
}
void StallWatchdog::workerExited(size_t index) { impl_->workerExited(index); }
void StallWatchdog::startChecks() { impl_->startChecks(); }
void StallWatchdog::stopChecks() { impl_->stopChecks(); }
void StallWatchdog::refresh() { impl_->refreshProgress(SteadyClock::now()); }
bool StallWatchdog::onChildExit(pid_t pid, int) { return impl_->onChildExit(pid); }
const WorkerProgress& StallWatchdog::worker(size_t index) const {
  return impl_->workers_.at(index).state;
}
uint64_t StallWatchdog::stallsTotal() const { return impl_->stalls_total_; }
bool StallWatchdog::stallDetectionOn() const { return impl_->stallDetectionOn(); }

}  // namespace cpprun::agent
