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
// as for any handled signal. Signals sent to the guardian with kill(2) are passed to the agent;
// ones the terminal sends to the whole foreground group already reached the agent and are not
// sent twice.
//
// Thread safety: call runUnderGuardian() from main() before any thread exists.
#pragma once

#include <functional>
#include <vector>

namespace cpprun::agent {

// Forks: the child runs `agent_main` and exits with its result; the calling process becomes the
// guardian and returns the agent's exit code (128+N when it died by signal N) once the agent
// and every descendant are gone. `forwarded_signals` are passed on to the agent. Returns -1
// (nothing forked) when fork fails.
int runUnderGuardian(const std::function<int()>& agent_main,
                     const std::vector<int>& forwarded_signals);

}  // namespace cpprun::agent
