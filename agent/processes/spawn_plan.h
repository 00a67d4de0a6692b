// What starting one worker needs, decided in the parent as plain data before the child exists:
// the resolved program path, argv and envp as the kernel takes them, the descriptors that become
// stdio, the session or process-group decision, the CPU mask and the memory policy. The child
// step of SystemProcessLauncher (system_process_launcher.cc) only reads a SpawnPlan; it allocates
// nothing. prepareSpawn() does every check that can fail without a child, so a bad spec fails
// before any clone, and the plan is testable without starting a process.
//
// The child reports a failure as a SpawnStep and errno; spawnStepError() turns that into the
// error of spawn(), naming the syscall that failed.
//
// Thread safety: plain data and pure functions (prepareSpawn reads the filesystem for the PATH
// lookup); a SpawnPlan is used by one thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "agent/processes/process_launcher.h"
#include "common/status.h"

namespace cpprun::agent {

// set_mempolicy(2) modes (linux/mempolicy.h; not included: it clashes with libnuma's numaif.h).
constexpr int kMpolPreferred = 1;
constexpr int kMpolBind = 2;
// Highest CPU and node number accepted in a ProcessSpec.
constexpr int kMaxCpu = 1 << 16;
constexpr int kMaxNode = 1 << 12;

// Everything the child reads. argv and envp point into args and env: a plan moves but is not
// copied (moving the vectors keeps the strings where they are).
struct SpawnPlan {
  SpawnPlan() = default;
  SpawnPlan(SpawnPlan&&) = default;
  SpawnPlan& operator=(SpawnPlan&&) = default;
  SpawnPlan(const SpawnPlan&) = delete;
  SpawnPlan& operator=(const SpawnPlan&) = delete;

  std::string program;  // argv[0] as the spec gave it, for errors
  std::string path;     // what execve gets: program, or where PATH found it
  std::vector<std::string> args;
  std::vector<std::string> env;  // "NAME=value": the agent's environment with the spec's applied
  std::vector<char*> argv;       // args' data, then nullptr
  std::vector<char*> envp;       // env's data, then nullptr
  int stdin_fd = -1;             // the spec's, or the launcher's /dev/null
  int stdout_fd = -1;            // -1: the agent's
  int stderr_fd = -1;            // -1: the agent's
  // >= 0: setsid and TIOCSCTTY on it (a session of its own); -1: setpgid(0, 0).
  int controlling_tty_fd = -1;
  // sched_setaffinity's mask (cpu_set_t's layout, CPU_ALLOC_SIZE bytes); empty: inherit.
  std::vector<unsigned long> cpu_mask;
  // set_mempolicy's arguments; mode -1: inherit.
  int mempolicy_mode = -1;
  std::vector<unsigned long> nodemask;
  unsigned long maxnode = 0;

  size_t cpuMaskBytes() const { return cpu_mask.size() * sizeof(unsigned long); }
};

// Builds the plan for `spec`. `agent_environ` is the agent's environment (null-terminated);
// `dev_null_fd` the stdin of a spec without one. Errors (kInvalidArgument): no program, a
// program without '/' not found in the child's PATH, a CPU or node number out of range.
Result<SpawnPlan> prepareSpawn(const ProcessSpec& spec, char* const* agent_environ,
                               int dev_null_fd);

// The child's steps between clone and execve, in order; each names the syscall it fails in.
enum class SpawnStep : int {
  kNone = 0,
  kSignals,              // rt_sigaction
  kSession,              // setsid
  kControllingTerminal,  // ioctl(TIOCSCTTY)
  kProcessGroup,         // setpgid
  kCgroupOpen,           // openat(cgroup.procs)
  kCgroupWrite,          // write(cgroup.procs)
  kParentDeathSignal,    // prctl(PR_SET_PDEATHSIG)
  kAgentGone,            // getppid
  kStdin,                // dup3, or fcntl(F_SETFD) when already in place
  kStdout,
  kStderr,
  kCpuAffinity,   // sched_setaffinity
  kMemoryPolicy,  // set_mempolicy
  kExec,          // execve
};

// "Operation not permitted (EPERM)".
std::string errnoText(int error);

// The error of a spawn whose child failed at `step` with `error`: "cannot run '<program>': <what>:
// <syscall>: <errno text>". kExec is kInvalidArgument, the bindings kUnavailable, the rest
// kInternal.
Status spawnStepError(const SpawnPlan& plan, const ProcessSpec& spec,
                      const std::string& cgroup_procs, SpawnStep step, int error);

}  // namespace cpprun::agent
