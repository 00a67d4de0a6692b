// HealthCheck: whether this node is fit to join the next rendezvous round, asked before every
// join (the first and each re-join after a restart). Two parts run side by side, both bounded by
// one timeout:
//   built-in  a function the launcher supplies (GPU and driver state when the job uses GPUs, the
//             interface NCCL/gloo would use is up, the log directory and --health-check-dirs
//             writable; launcher/node_health.h). It may block (a CUDA driver query, a hung
//             file system), so it runs on a thread of its own and the loop only gets its answer.
//   command   --health-check CMD, run as `/bin/sh -c CMD` through the agent's ProcessLauncher
//             (own process group, parent-death signal, reaped by the agent's ChildReaper). Its
//             exit status decides (0: healthy); stdout and stderr go to one pipe read by the
//             loop, and its last lines are kept for the report. Past the timeout its whole
//             process group is SIGKILLed and the check fails.
// The node is healthy when both pass. Nothing here blocks the loop.
//
//   idle ──run()──▶ running ──(built-in answered, command exited and its pipe at EOF,
//                     │         or the timeout)──▶ idle (the callback gets the result)
//
// Thread safety: loop thread only (run, onChildExit, the callback). The built-in check's thread
// only posts its answer to the loop; an answer that comes after the timeout is dropped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

class ProcessLauncher;

// The launcher's built-in checks: one text per problem found (empty: healthy). Runs on a thread
// of its own; may block.
using BuiltinHealthCheck = std::function<std::vector<std::string>()>;

struct HealthCheckOptions {
  std::string command;                                          // --health-check; empty: none
  BuiltinHealthCheck builtin;                                   // empty: no built-in checks
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // --health-check-timeout
  size_t tail_lines = 20;  // the command's last lines kept for the report
  // Extra environment of the command (CPPRUN_HEALTH_CHECK_ATTEMPT is set per run).
  std::map<std::string, std::string> env = {};
};

struct HealthResult {
  bool healthy = true;
  std::string check;   // what failed: "command", "built-in" or "timeout"; empty when healthy
  std::string reason;  // one line naming what failed and why
  std::vector<std::string> output_tail;  // the command's last lines (stdout and stderr)
  double seconds = 0;                    // how long the checks took
};

class HealthCheck {
 public:
  using Done = std::function<void(const HealthResult&)>;
  // REQUIRES: `io` and `launcher` outlive this object.
  HealthCheck(boost::asio::io_context& io, ProcessLauncher& launcher, HealthCheckOptions options);
  ~HealthCheck();
  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

  // Whether there is anything to check (a command or built-in checks).
  bool enabled() const;
  // Runs the checks for the join of `attempt`; `done` runs on the loop once. REQUIRES: no run
  // in progress.
  void run(int attempt, Done done);
  // A child exited (from the agent's ChildReaper): true when it was the check's command.
  bool onChildExit(pid_t pid, int wait_status);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
