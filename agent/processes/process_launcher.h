// ProcessLauncher: how the agent starts workers and signals them — the seam between the
// supervisor's logic and the operating system. The real launcher (makeSystemProcessLauncher)
// starts every worker with vfork-class process creation (clone(CLONE_VM | CLONE_VFORK): no copy
// of the agent's page tables) as the leader of its own process group with a parent-death signal,
// bound to the CPUs and memory nodes its spec names; tests substitute a fake that records what
// it was asked to do.
//
// Exits are not reported here: the agent's event loop reaps children (ChildReaper) and hands
// each exit to the supervisor, so a fake launcher's "processes" exit when a test says so.
//
// Thread safety: call from the agent's loop thread only. The parent-death signal is tied to
// the thread that spawns, so that thread must live as long as the workers should.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::agent {

struct ProcessSpec {
  // argv[0] is the program; it is looked up in PATH when it contains no '/'.
  std::vector<std::string> argv;
  // Set or replaced on top of the agent's own environment.
  std::map<std::string, std::string> env;
  // Descriptors that become the child's stdin, stdout and stderr. stdin -1: /dev/null; stdout
  // and stderr -1: the agent's. The launcher does not take ownership; the caller closes its
  // copies after spawn().
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // A terminal (a pseudo-terminal's slave, agent/console/worker_terminal.h) that becomes the
  // child's controlling terminal: the child then starts a session of its own (setsid, so its
  // process group id is still its pid) and takes the terminal (TIOCSCTTY), which makes its group
  // the terminal's foreground group: window-size changes (SIGWINCH) and the hang-up when the agent
  // closes the master reach it, and it may read the terminal and change its modes. -1: none
  // (a new process group in the agent's session, as before).
  int controlling_tty_fd = -1;
  // CPU affinity for the child (sched_setaffinity before exec); empty: inherit.
  std::vector<int> cpus;
  // Memory policy for the child (set_mempolicy before exec); empty nodes: inherit.
  enum class MemoryPolicy { kInherit, kBind, kPreferred } memory_policy = MemoryPolicy::kInherit;
  std::vector<int> memory_nodes;
  // kBind: MPOL_BIND (allocations only on these nodes); kPreferred: MPOL_PREFERRED (the kernel
  // prefers the lowest of the nodes, falls back to others). Numbers are the kernel's CPU and
  // node ids. If applying either fails in the child, spawn() fails (kUnavailable) with an error
  // naming the CPUs or nodes and errno; the caller decides whether a binding is required (leave
  // these empty when it is not and cannot be applied). A negative or huge number is
  // kInvalidArgument.
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts the process. On success it runs in a new process group whose id is the returned
  // pid (in a new session too when the spec names a controlling terminal), its stdin is the
  // spec's (else /dev/null), no other descriptor of the agent is open in it, its signal mask is
  // empty and its signal dispositions are the defaults (a signal the agent's own parent had
  // ignored, as nohup does, stays ignored; SIGPIPE does not), it has the spec's CPU affinity and
  // memory policy, and it receives SIGKILL if the thread that spawned it (or the agent) dies.
  // A program that is not found or cannot be executed is an error naming it and errno; such a
  // child has been reaped already.
  virtual Result<pid_t> spawn(const ProcessSpec& spec) = 0;
  // Sends `signo` to every process in the group `pgid`. A group that no longer exists is not
  // an error.
  virtual Status signalGroup(pid_t pgid, int signo) = 0;
  // Sends `signo` to the one process `pid` (not its group). A process that no longer exists
  // is not an error.
  virtual Status signalProcess(pid_t pid, int signo) = 0;
  // Sends `signo` to a worker started by spawn(): to the process `pid` itself while it has not
  // been reaped (`running`; it may have moved to another process group, where a signal to its
  // group would never reach it), to every process left in its group `pid` (its children, also
  // after it exited), and with SIGKILL also to every process below it, whatever group or session
  // it moved to. Processes that no longer exist are not an error.
  virtual Status signalWorker(pid_t pid, bool running, int signo) = 0;
  // SIGKILLs every child of this process that is not in `known` — processes that double-forked
  // out of a worker's group and were re-parented to the agent (a child subreaper). Returns how
  // many were killed; the reaper collects them.
  virtual size_t killAdoptedOrphans(const std::vector<pid_t>& known) = 0;
  // The state letter of a worker started by spawn() (processState below: 'D' uninterruptible
  // sleep, 0 gone). A fake launcher reports its own.
  virtual char stateOf(pid_t pid);
  // A worker this launcher did not start itself (forked by the warm process, warm_start_launcher.h)
  // whose process group `pgid` is now the agent's to contain: the sentinel is told of it.
  virtual void adopt(pid_t pgid) { (void)pgid; }
};

// Where the real launcher contains its workers beyond their process groups (JobContainment,
// agent/processes/job_containment.h): the job's cgroup, and the sentinel's pipe.
struct WorkerContainment {
  // <job cgroup>/cgroup.procs: each worker moves itself into it before exec (a failure to do
  // so fails its start, naming the file). Empty: no cgroup.
  std::string cgroup_procs;
  // Non-blocking write end of the sentinel's pipe: "+<pgid>\n" for every worker started,
  // "-<pgid>\n" once its group has been killed after its exit (a group number that may be
  // reused). -1: none.
  int group_report_fd = -1;
};

// The real launcher (clone + execve, Linux process groups, PR_SET_PDEATHSIG, sched_setaffinity,
// set_mempolicy; agent/processes/system_process_launcher.cc).
std::unique_ptr<ProcessLauncher> makeSystemProcessLauncher(WorkerContainment containment = {});

// Children of `parent` according to /proc (for subreaper clean-up and for tests).
std::vector<pid_t> childrenOf(pid_t parent);
// The parent of `pid` according to /proc/<pid>/stat; -1 when it is gone or unreadable.
pid_t parentOf(pid_t pid);
// The state letter /proc gives `pid` ('R', 'S', 'D' uninterruptible, 'Z' zombie, ...); 0 when
// it is gone.
char processState(pid_t pid);
// Every descendant of `ancestor` (children, their children, ...), from one /proc scan.
std::vector<pid_t> descendantsOf(pid_t ancestor);

}  // namespace cpprun::agent
