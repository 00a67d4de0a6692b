// PythonProgress: progress stamps for Python workers that make no progress calls themselves, so
// that --stall-timeout catches a hang in an unchanged trainer.
//
// With stall detection on, the supervisor writes `sitecustomize.py` (the text below) into the
// attempt's log directory and puts that directory first on every worker's PYTHONPATH. At
// interpreter start the module:
//   - hands over to any other sitecustomize further down the path (Debian's, a site's own), so
//     nothing the environment relied on is lost;
//   - when CPPRUN_PYTHON_PROGRESS (the stamp interval, ms) and CPPRUN_PROGRESS_FILE are set,
//     removes CPPRUN_PYTHON_PROGRESS from its environment (so Python children it starts do not
//     stamp for it) and starts a daemon thread that, every interval, asks the interpreter's main
//     thread to run one callback (Py_AddPendingCall through ctypes). The callback touches the
//     progress file (its modification time; the counter a trainer writes is left alone). The
//     thread itself creates the file when it first sees torch.distributed's default group up
//     (that is the first progress), so a hang in the first collective is caught too.
//
// What counts as progress: the main thread running Python bytecode once torch.distributed's
// default process group is initialised. A main thread blocked in one C call — a collective, a
// CUDA synchronisation, a read that never returns, a long time.sleep — runs no pending call and
// stops stamping; a busy Python loop keeps stamping. Before init_process_group returns (imports,
// CUDA and NCCL set-up, the rendezvous) nothing is stamped: --stall-first-timeout bounds that
// phase. It cannot see: a hang in a thread other than the main one, a main thread that loops in
// Python without making progress, programs that never initialise torch.distributed (they are
// bounded by the first timeout only). Once the program has ended (atexit) it creates
// CPPRUN_PROGRESS_FILE + ".exiting": the interpreter's finalization (torch's and NCCL's teardown)
// runs no Python and is bounded by --stall-first-timeout, not --stall-timeout. It also registers
// faulthandler on SIGUSR1 into CPPRUN_STACK_FILE (Python stacks on a stall) unless the program
// takes SIGUSR1 for itself.
//
// Thread safety: free functions, no state; callable from any thread.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "common/status.h"

namespace cpprun::agent {

// The environment variable that switches the stamps on for one worker (the interval, ms).
inline constexpr const char* kPythonProgressVariable = "CPPRUN_PYTHON_PROGRESS";

// "<run dir>/python": the module's folder, one for every attempt of the run (a worker the
// --warm-restart warm process forks has the PYTHONPATH a cold one of any attempt has), where the
// warm process's own module is written too.
std::string pythonModuleDirectory(const std::string& run_dir);

// The module's source text.
const std::string& pythonProgressModule();

// Writes `dir`/sitecustomize.py (creating `dir`); an error names the path.
Status writePythonProgressModule(const std::string& dir);

// Adds what a worker needs to `env` (set on top of the agent's environment, whose PYTHONPATH is
// `inherited_pythonpath`, may be null): `dir` first on PYTHONPATH, then what was there, and the
// stamp interval (none when it is 0: the module only records imports, --warm-restart).
void addPythonProgress(std::map<std::string, std::string>& env, const std::string& dir,
                       std::chrono::milliseconds interval, const char* inherited_pythonpath);

// The interval for a given between-steps stall timeout: a tenth of it, between 50 and 500 ms (a
// hang is then declared between one interval early and the check interval late).
std::chrono::milliseconds pythonProgressInterval(std::chrono::milliseconds stall_timeout);

}  // namespace cpprun::agent
