#include "agent/supervision/worker_wiring.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "agent/console/stdin_forwarder.h"
#include "agent/console/worker_terminal.h"
#include "agent/supervision/python_progress.h"
#include "common/logging.h"

namespace cpprun::agent {

WorkerWiring::WorkerWiring(boost::asio::io_context& io, Options options,
                           std::shared_ptr<OutputSinks> sinks)
    : io_(io), options_(std::move(options)), sinks_(std::move(sinks)) {}

Status WorkerWiring::beginAttempt(const std::string& attempt_dir, bool stall_detection_on) {
  python_progress_dir_ = preparePythonProgress(attempt_dir, stall_detection_on);
  return openFilteredCopies(attempt_dir);
}

// The directory of the run's sitecustomize (agent/supervision/python_progress.h), or "" when
// neither its stamps (stall detection with --python-progress on) nor --warm-restart's import
// record are wanted, there is no log directory, or the module could not be written (it never
// stops a job from starting). One folder for every attempt, beside the attempts' own: a worker
// the warm process forks has the PYTHONPATH a cold one of any attempt has.
std::string WorkerWiring::preparePythonProgress(const std::string& attempt_dir,
                                                bool stall_detection_on) {
  stamps_ = stall_detection_on && options_.python_progress;
  if ((!stamps_ && !options_.warm_restart) || attempt_dir.empty()) return "";
  const std::string dir =
      pythonModuleDirectory(std::filesystem::path(attempt_dir).parent_path().string());
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
Status WorkerWiring::openFilteredCopies(const std::string& attempt_dir) {
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

// Where one stream of a worker goes: a pty when the route asks for one and one can be had
// (else a pipe, after one warning), with its read end (the agent's) and write end.
Status WorkerWiring::openStream(StreamRoute& route, StreamEnds& ends) {
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

Status WorkerWiring::spawn(AttemptWorker& w, const std::string& rank_dir,
                           std::map<std::string, std::string> env, ProcessLauncher& launcher,
                           const std::function<void()>& on_eof) {
  WorkerOutputPlan plan =
      planWorkerOutput(options_.output, w.spec.local_rank, w.spec.rank, rank_dir);
  if (plan.out.filterable) plan.out.filtered = filtered_out_;
  if (plan.err.filterable) plan.err.filtered = filtered_err_;
  if (!rank_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(rank_dir, ec);
    if (ec) return invalidArgument("cannot create log directory " + rank_dir + ": " + ec.message());
  }
  StreamEnds out_ends;
  StreamEnds err_ends;
  if (Status s = openStream(plan.out, out_ends); !s.isOk()) return s;
  if (Status s = openStream(plan.err, err_ends); !s.isOk()) {
    ::close(out_ends.read);
    ::close(out_ends.write);
    return s;
  }
  auto out = WorkerOutput::create(io_, out_ends.read, plan.out, 0, on_eof, sinks_);
  auto err = WorkerOutput::create(io_, err_ends.read, plan.err, options_.output.stderr_tail_lines,
                                  on_eof, sinks_);
  ProcessSpec spec;
  spec.argv = w.spec.argv;
  spec.env = std::move(env);
  if (!rank_dir.empty() && !python_progress_dir_.empty()) {
    addPythonProgress(
        spec.env, python_progress_dir_,
        stamps_ ? pythonProgressInterval(options_.stall_timeout) : std::chrono::milliseconds(0),
        std::getenv("PYTHONPATH"));
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
                          ? launcher.spawn(spec)
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
  w.out = std::move(out).value();
  w.err = std::move(err).value();
  w.out->start();
  w.err->start();
  return Status::ok();
}

void WorkerWiring::resizeTerminals(std::vector<AttemptWorker>& workers) {
  const auto size = consoleWindowSize();
  if (!size) return;
  for (AttemptWorker& w : workers) {
    if (w.out) w.out->resizeTerminal(*size);
    if (w.err) w.err->resizeTerminal(*size);
  }
}

}  // namespace cpprun::agent
