// Guardian: the small process that stands between the caller (a shell, srun, mpirun) and the
// agent, so that no worker and no descendant of one outlives the job even when the agent is
// SIGKILLed (by a user, the OOM killer or a scheduler).
//
//   cpprun (guardian: child subreaper, forwards signals, waits)
//     └─ agent (child subreaper, event loop, store)      parent-death signal: SIGTERM
//          └─ worker 0..n-1 (own process groups)          parent-death signal: SIGKILL
//               └─ grandchildren ...
//
// Agent killed: its workers die by their parent-death signal, and everything below them is
// re-parented to the guardian (the nearest subreaper), which kills every descendant left and
// exits 128+signal. Guardian killed: the agent receives SIGTERM and tears the workers down
// as for any handled signal. Both killed at once (kill -9 of cpprun's process group): the job's
// sentinel and cgroup end what is left (job_containment.h). Signals sent to the guardian with
// kill(2) are passed to the agent; ones the terminal sends to the whole foreground group already
// reached the agent and are not sent twice. When the agent has ended, however it ended, the
// guardian puts cpprun's terminal back in the modes it found (the agent changes them while it
// forwards keystrokes to a worker's terminal; stdin_forwarder.h).
//
// Thread safety: call runUnderGuardian() from main() before any thread exists.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "agent/processes/process_launcher.h"

namespace cpprun::agent {

struct GuardianOptions {
  // The signals that stop the job (--signals-to-handle). Every other signal that would end a
  // process by default is passed on too; the agent logs and ignores those (signal_policy.h).
  std::vector<int> forwarded_signals;
  // A run directory made for this run only (removed at the end): the sentinel removes it when
  // both cpprun processes are killed. Empty: none.
  std::string temporary_run_dir;
  // Once the agent is gone: how long the guardian waits for the SIGKILLed processes it left to
  // be reaped (--reap-timeout). Those still alive then (in uninterruptible sleep) are named in
  // the log by pid, state and wait channel, and cpprun exits kExitUnreaped. When the agent has
  // already given up on them (it exited kExitUnreaped) and every process left is in D, the
  // guardian does not wait a second time.
  std::chrono::milliseconds reap_timeout{5000};
};

// The exit code of a job that left a process SIGKILL could not end within the reap bound.
inline constexpr int kExitUnreaped = 7;

// Starts the job's containment (job_containment.h), then forks: the child runs `agent_main`
// with what its launcher needs of the containment and exits with its result; the calling
// process becomes the guardian and returns the agent's exit code (128+N when it died by signal
// N) once the agent and every descendant are gone, or kExitUnreaped when a descendant outlived
// the reap bound after SIGKILL. Returns -1 (nothing forked) when fork fails.
// Signals stay blocked in the caller when it returns (a signal arriving then must not end it
// by its default action before it has exited with the agent's code).
int runUnderGuardian(const std::function<int(const WorkerContainment&)>& agent_main,
                     const GuardianOptions& options);

}  // namespace cpprun::agent
