// JobContainment: what keeps a job's processes from outliving cpprun when both of cpprun's own
// processes die at once — `kill -9 -- -PGID` of cpprun's process group (as `timeout -s KILL`
// and many job tools do), or the OOM killer taking both. The guardian alone covers the agent's
// death and the agent alone the guardian's; this covers the two together.
//
//   sentinel (own session)   holds the read end of a pipe that only the guardian and the agent
//                            can write; EOF without "done" = both died: it kills what is left
//   cpprun (guardian) ─ agent ─ workers      workers started inside the job's cgroup, if any
//
// Two layers:
//  - The job's cgroup (cgroup v2), made below cpprun's own cgroup where this process may (root,
//    or a delegated subtree as systemd's user@.service gives): every worker starts in it, so
//    cgroup.kill ends every process the job started, whatever it did with its process group or
//    session (setsid, a daemon, a double fork).
//  - The sentinel: a small process forked (twice, so it is nobody's child in cpprun's tree) in a
//    session of its own, with every catchable signal blocked, so no signal to cpprun's group or
//    terminal reaches it. When the pipe reaches EOF without "done" it kills the cgroup, or,
//    without one, every process group the agent reported a worker in, removes the run's
//    temporary directory, and exits. A normal end: the guardian writes "done" and waits (at
//    most 2 s) for it to exit, so nothing of cpprun's outlives cpprun.
//
// Without a cgroup (no cgroup v2 mounted, not permitted) the fallback guarantees: when both
// cpprun processes are SIGKILLed together the workers die by their parent-death signal and
// every process still in a worker's process group by the sentinel's SIGKILL; only a descendant
// that left its worker's group (setsid, a daemon) survives that case. docs/operations.md says so.
//
// Thread safety: start() and finish() from the guardian before/after the agent (one thread);
// WorkerContainment is a plain value the agent's launcher uses on its loop thread.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "agent/processes/process_launcher.h"

namespace cpprun::agent {

class JobContainment {
 public:
  // In the guardian before the agent is forked, before becoming a child subreaper (the
  // sentinel must not be re-parented to cpprun). `temporary_run_dir` (may be empty) is removed
  // by the sentinel if cpprun dies. Never fails: what cannot be had is logged at debug level and
  // the job runs with the guardian's and the agent's own clean-up.
  static std::unique_ptr<JobContainment> start(const std::string& temporary_run_dir);
  ~JobContainment();
  JobContainment(const JobContainment&) = delete;
  JobContainment& operator=(const JobContainment&) = delete;

  // What the agent's launcher needs: where workers go, and where their groups are reported.
  WorkerContainment forWorkers() const;
  // In the guardian once the agent is gone: kills whatever is still in the cgroup and removes it
  // (waiting at most `bound_ms` for it to empty: a process in uninterruptible sleep may never
  // leave), tells the sentinel the job ended in order and waits (at most 2 s) for it to exit.
  // Returns how many processes the cgroup still held.
  size_t finish(int bound_ms = 10000);

  const std::string& cgroupDir() const { return cgroup_dir_; }
  pid_t sentinelPid() const { return sentinel_pid_; }

 private:
  JobContainment() = default;

  std::string cgroup_dir_;  // empty: no cgroup
  pid_t sentinel_pid_ = -1;
  int sentinel_pidfd_ = -1;
  int control_fd_ = -1;  // the guardian's write end; the agent inherits it
  bool finished_ = false;
};

// The cgroup v2 directory of this process (/sys/fs/cgroup/<path>), "" when there is none.
std::string ownCgroupDir();

// SIGKILLs every process in the cgroup `dir` (cgroup.kill where the kernel has it) and waits
// until it is empty, at most `bound_ms`. Returns how many processes it held.
size_t killCgroup(const std::string& dir, int bound_ms);

}  // namespace cpprun::agent
