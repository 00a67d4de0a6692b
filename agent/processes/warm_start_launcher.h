// WarmStartLauncher: --warm-restart. A ProcessLauncher in front of the real one that starts the
// Python workers of later attempts from a warm process instead of a fresh interpreter, so a
// restarted worker does not import torch (and the rest of its packages) again.
//
//   first Python spawn ─▶ warm process started (the worker's python, its interpreter-wide
//   environment), waiting for a record; the cold workers get CPPRUN_WARM_RECORD
//        │ local rank 0's process group is up: its sitecustomize sends its module names
//        ▼
//   warm process imports the installed ones (never the program's own files), checks it holds
//   no thread, no CUDA, no process group, freezes its heap, says "ready" (its RSS)
//        │ a later spawn: checks below pass
//        ▼
//   fork ─▶ middle process exits ─▶ the worker is re-parented to the agent (a child subreaper)
//   and becomes a cold start's equal: own process group (or session and terminal), the parent-
//   death signal, the spec's stdio and nothing else open, CPU affinity, memory policy, exactly
//   the environment a cold start gets, sys.argv, sys.path[0], fresh random seeds; then runs the
//   program as __main__ (docs/supervision.md lists what still differs).
//
// A spawn falls back to the real launcher (a cold start) when the spec is not `python -u
// [-m] PROGRAM ...`, the interpreter or an interpreter-wide variable (PYTHON*, LANG, LC_*,
// OMP/MKL/OPENBLAS_NUM_THREADS, LD_PRELOAD, LD_LIBRARY_PATH) differs from the warm process's,
// the program file changed on disk, the warm process is not ready yet, refuses (a changed
// package file, a thread, CUDA), died, does not answer within the bound, or grew over its memory
// bound. Each reason is logged once. A warm process that cannot serve again is killed and, at
// the next cold spawn, a new one starts from that spawn's spec.
//
// The warm process is the agent's child in its own process group, in the job's containment;
// killAdoptedOrphans never takes it for an orphan; the launcher kills it when destroyed.
//
// Hot spares: the agent shares the modules its warm process holds (OnReady) through the job's
// store; a spare that reads them starts its own warm process from a template of its workers
// (WarmStartOptions::spare_like) and has it import them while it waits (prewarm), so a spare
// that replaces a lost node forks its workers as a restarted node does.
//
// Thread safety: loop thread only, as every ProcessLauncher; the warm process's messages are read
// on the loop. spawn() waits for the warm process's answer (a fork: milliseconds) at most
// `answer_timeout`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/processes/process_launcher.h"
#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

struct WarmStartOptions {
  // Where the warm process's module is written (cpprun_warm.py); the run's folder.
  std::string module_dir;
  // How long a spawn waits for the warm process to fork.
  std::chrono::milliseconds answer_timeout{2000};
  // The warm process may not grow past its RSS when ready times this factor plus the slack.
  double memory_growth_factor = 2.0;
  long memory_slack_kib = 512 * 1024;
  // A worker of this node as a cold start would run it, less its identity (argv and the
  // interpreter-wide environment matter): what a hot spare's warm process starts from before
  // the spare has an attempt (prewarm). Empty argv: no pre-warming.
  ProcessSpec spare_like;
};

class WarmStartLauncher : public ProcessLauncher {
 public:
  // The installed modules the node's warm process holds once it is ready (loop thread): what the
  // agent shares with the job's hot spares.
  using OnReady = std::function<void(const std::vector<std::string>& modules)>;

  // REQUIRES: `io` outlives the launcher; `cold` is not null.
  WarmStartLauncher(boost::asio::io_context& io, std::unique_ptr<ProcessLauncher> cold,
                    WarmStartOptions options, OnReady on_ready);
  ~WarmStartLauncher() override;
  WarmStartLauncher(const WarmStartLauncher&) = delete;
  WarmStartLauncher& operator=(const WarmStartLauncher&) = delete;

  Result<pid_t> spawn(const ProcessSpec& spec) override;
  Status signalGroup(pid_t pgid, int signo) override;
  Status signalProcess(pid_t pid, int signo) override;
  Status signalWorker(pid_t pid, bool running, int signo) override;
  size_t killAdoptedOrphans(const std::vector<pid_t>& known) override;
  char stateOf(pid_t pid) override;
  void adopt(pid_t pgid) override;

  // A hot spare learnt what the job's workers import (another node's warm process, through the
  // job's store): start the warm process from options.spare_like, if none runs, and have it
  // import `modules` now, before the spare is needed. Nothing when the warm process is ready.
  void prewarm(const std::vector<std::string>& modules);

  // The warm process's pid (-1: none); for /status and tests.
  pid_t warmPid() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The warm process's Python source (agent/processes/warm_process_module.py.inc).
const std::string& warmProcessModule();

// Whether `argv` is a Python worker the warm process can start (`PYTHON -u PROGRAM ...` or
// `PYTHON -u -m MODULE ...`); the reason when it is not.
std::string warmIneligibility(const std::vector<std::string>& argv);

// The variables a warm-started worker inherits from the warm process's start rather than from
// its own environment (the interpreter's PYTHON*, LANG and LC_*, the thread counts OpenMP, MKL
// and OpenBLAS read when loaded, the loader's LD_PRELOAD and LD_LIBRARY_PATH): they must be equal.
bool interpreterWideVariable(const std::string& name);

// Why a warm process whose RSS was `ready_kib` when it became ready and is `now_kib` may not fork
// any more ("": it may): past ready_kib x memory_growth_factor + memory_slack_kib. Nothing runs in
// it between forks, so growth means something does (a thread a library started, a leak).
std::string warmProcessGrowth(long ready_kib, long now_kib, const WarmStartOptions& options);

// The module record shared through the job's store (a JSON array of module names), and its
// reader: anything read from the store is untrusted, so a value that is not an array of at most
// kMaxWarmModules dotted Python names of at most 200 characters (letters, digits, "_", "-") is an
// error naming why.
inline constexpr size_t kMaxWarmModules = 20000;
std::string warmImportsRecord(const std::vector<std::string>& modules);
Result<std::vector<std::string>> parseWarmImportsRecord(const std::string& text);

}  // namespace cpprun::agent
