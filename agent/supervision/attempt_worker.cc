#include "agent/supervision/attempt_worker.h"

#include <sys/wait.h>

#include "agent/supervision/failure_report.h"

namespace cpprun::agent {

bool exitedCleanly(int wait_status) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

std::string describeWaitStatus(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return "was killed by " + signalName(WTERMSIG(wait_status));
  }
  return "exited with code " + std::to_string(WEXITSTATUS(wait_status));
}

WorkerSnapshot snapshotOf(const AttemptWorker& w, const WorkerProgress& progress,
                          std::chrono::steady_clock::time_point now) {
  WorkerSnapshot ws;
  ws.rank = w.spec.rank;
  ws.local_rank = w.spec.local_rank;
  ws.numa_binding = w.spec.binding;
  ws.pid = w.pid;
  ws.alive = w.pid > 0 && !w.exited;
  if (w.exited && WIFSIGNALED(w.status)) ws.signal = WTERMSIG(w.status);
  if (w.exited && WIFEXITED(w.status)) ws.exit_code = WEXITSTATUS(w.status);
  ws.progress = progress.progress;
  ws.seconds_since_progress =
      w.pid > 0 ? std::chrono::duration<double>(now - progress.last_progress).count() : 0;
  ws.stalled = progress.stalled;
  ws.stdout_bytes = w.out ? w.out->bytesRead() : 0;
  ws.stderr_bytes = w.err ? w.err->bytesRead() : 0;
  return ws;
}

std::string runningRanks(const std::vector<AttemptWorker>& workers) {
  std::string ranks;
  for (const AttemptWorker& w : workers) {
    if (!w.exited) ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.spec.rank);
  }
  return ranks;
}

}  // namespace cpprun::agent
