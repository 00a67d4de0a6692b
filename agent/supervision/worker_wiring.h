// WorkerWiring: what connects one worker of the supervisor's attempt to cpprun's console, log
// files and stdin — its stdout and stderr (a pseudo-terminal when the route asks for one and one
// can be had, else a pipe: worker_terminal.h), the readers that prefix and route its lines
// (worker_output.h), the attempt's --duplicate-std{out,err}-filters copies, its stdin
// (stdin_forwarder.h) and its automatic Python progress stamps (python_progress.h) — and the
// spawn through the ProcessLauncher with those descriptors. The supervisor (supervisor.h) keeps
// the attempt's state machine; this keeps the plumbing out of it.
//
// Thread safety: loop thread only (the supervisor's Asio event loop); the readers it makes run
// there and call on_eof there. The OutputSinks it writes through are thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/console/worker_output.h"
#include "agent/processes/process_launcher.h"
#include "agent/supervision/attempt_worker.h"
#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

class StdinForwarder;

class WorkerWiring {
 public:
  struct Options {
    OutputOptions output;
    StdinForwarder* stdin_forwarder = nullptr;   // null: every worker reads /dev/null
    std::chrono::milliseconds stall_timeout{0};  // sets the Python stamps' interval
    bool python_progress = false;                // --python-progress
    bool warm_restart = false;                   // --warm-restart: the import record
  };

  // REQUIRES: `io` and `options.stdin_forwarder` (may be null) outlive the wiring; `sinks` is
  // not null.
  WorkerWiring(boost::asio::io_context& io, Options options, std::shared_ptr<OutputSinks> sinks);
  WorkerWiring(const WorkerWiring&) = delete;
  WorkerWiring& operator=(const WorkerWiring&) = delete;

  // A new attempt whose log directory is `attempt_dir` ("": none): opens its filtered copies
  // (the previous attempt's close once their streams are done) and, with `stall_detection_on`,
  // writes its automatic progress module (a failure there only turns the stamps off). An error
  // (a filtered copy that cannot be opened) means the attempt cannot start.
  Status beginAttempt(const std::string& attempt_dir, bool stall_detection_on);

  // Starts `w` (its spec) with `env` on top of the agent's environment: makes `rank_dir` (its log
  // directory, "": none), opens its streams, spawns it through `launcher` and starts reading its
  // output; `on_eof` runs when either stream reaches EOF. Sets w.pid, w.out and w.err. An error
  // names the rank; nothing of the worker is left open then.
  Status spawn(AttemptWorker& w, const std::string& rank_dir,
               std::map<std::string, std::string> env, ProcessLauncher& launcher,
               const std::function<void()>& on_eof);

  // cpprun's terminal changed size: every worker pty of `workers` follows.
  void resizeTerminals(std::vector<AttemptWorker>& workers);

 private:
  // A stream's read end (the agent's) and write end (the worker's).
  struct StreamEnds {
    int read = -1;
    int write = -1;
  };
  Status openStream(StreamRoute& route, StreamEnds& ends);
  Status openFilteredCopies(const std::string& attempt_dir);
  std::string preparePythonProgress(const std::string& attempt_dir, bool stall_detection_on);

  boost::asio::io_context& io_;
  Options options_;
  std::shared_ptr<OutputSinks> sinks_;
  // This attempt's --duplicate-std{out,err}-filters files; null without filters.
  std::shared_ptr<FilteredCopy> filtered_out_;
  std::shared_ptr<FilteredCopy> filtered_err_;
  bool stamps_ = false;  // this attempt's workers stamp progress (preparePythonProgress)
  std::string python_progress_dir_;  // this attempt's, see preparePythonProgress
  bool warned_pty_ = false;
};

}  // namespace cpprun::agent
