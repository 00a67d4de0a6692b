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
// Thread safety: loop thread only, as every ProcessLauncher. spawn() waits for the warm process's
// answer (a fork: milliseconds) at most `answer_timeout`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "agent/processes/process_launcher.h"

namespace cpprun::agent {

struct WarmStartOptions {
  // Where the warm process's module is written (cpprun_warm.py); the run's folder.
  std::string module_dir;
  // How long a spawn waits for the warm process to fork.
  std::chrono::milliseconds answer_timeout{2000};
  // The warm process may not grow past its RSS when ready times this factor plus the slack.
  double memory_growth_factor = 2.0;
  long memory_slack_kib = 512 * 1024;
};

// The warm process's Python source (agent/processes/warm_process_module.py.inc).
const std::string& warmProcessModule();

// Whether `argv` is a Python worker the warm process can start (`PYTHON -u PROGRAM ...` or
// `PYTHON -u -m MODULE ...`); the reason when it is not.
std::string warmIneligibility(const std::vector<std::string>& argv);

std::unique_ptr<ProcessLauncher> makeWarmStartLauncher(std::unique_ptr<ProcessLauncher> cold,
                                                       WarmStartOptions options);

}  // namespace cpprun::agent
