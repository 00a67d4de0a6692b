#include "agent/supervision/python_progress.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace cpprun::agent {

namespace {

// Python 3.7+ (Debian's 3.11 and torch 2.x wheels' 3.12). Kept short: it runs in every worker
// at start. `os.utime(fd)` is futimens(2): one syscall per stamp.
const char* const kModule =
    R"PY(# Written by cpprun (agent/supervision/python_progress.h): automatic progress stamps for --stall-timeout.
# It runs at interpreter start, then hands over to the next sitecustomize on sys.path.
def _cpprun_start_progress():
    import os
    interval_ms = os.environ.pop("CPPRUN_PYTHON_PROGRESS", None)
    path = os.environ.get("CPPRUN_PROGRESS_FILE")
    if not interval_ms or not path:
        return
    import ctypes
    import faulthandler
    import signal
    import sys
    import threading
    import time

    interval = max(int(interval_ms), 10) / 1000.0
    fd = [None]  # made once torch.distributed is up: the file's appearance is the first progress
    stacks = os.environ.get("CPPRUN_STACK_FILE")
    if stacks and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        # Register first, then give the file its name: cpprun sends SIGUSR1 only once it exists.
        out = open(stacks + ".tmp", "a")
        faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
        os.rename(stacks + ".tmp", stacks)
    else:
        stacks = None

    def stacks_off():
        nonlocal stacks
        stacks = None

    pending = [False]
    exiting = [False]

    def at_exit():
        # The program is done and the interpreter finalizes (torch's and NCCL's teardown can take
        # seconds, and no Python runs to stamp): the marker tells cpprun to bound this phase by
        # --stall-first-timeout instead. No SIGUSR1 either: finalization removes faulthandler's
        # handler, and the signal would kill.
        exiting[0] = True
        try:
            os.close(os.open(path + ".exiting", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            if stacks is not None:
                os.unlink(stacks)
        except OSError:
            pass
        stacks_off()

    def distributed_up():
        initialized = getattr(sys.modules.get("torch.distributed"), "is_initialized", None)
        return initialized is not None and initialized()

    def stamp(_):
        # On the main thread, between two bytecodes, perhaps in the middle of an import (modules
        # half made): it must never raise, and must return 0, or the interpreter fails there.
        pending[0] = False
        try:
            if stacks is not None and signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
                # The program took SIGUSR1 for itself: cpprun must not send it.
                os.unlink(stacks)
                stacks_off()
            os.utime(fd[0])
        except BaseException:
            pass
        return 0

    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(stamp)
    add_pending_call = ctypes.pythonapi.Py_AddPendingCall
    add_pending_call.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    add_pending_call.restype = ctypes.c_int

    def ask():
        # Until torch.distributed's default group is up (imports, CUDA and NCCL set-up, the
        # rendezvous: --stall-first-timeout's phase) there is no file; this thread makes it as
        # soon as it sees the group, even while the main thread is blocked in a first collective.
        # From then on only the main thread stamps, from the pending call.
        while True:
            time.sleep(interval)
            if fd[0] is None:
                try:
                    if distributed_up():
                        fd[0] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except BaseException:
                    pass
            elif exiting[0]:
                return
            elif not pending[0]:
                pending[0] = True
                if add_pending_call(ctypes.cast(callback, ctypes.c_void_p), None) != 0:
                    pending[0] = False

    _cpprun_start_progress.keep = callback
    import atexit
    atexit.register(at_exit)  # registered first, so it runs after the program's own handlers
    threading.Thread(target=ask, name="cpprun-progress", daemon=True).start()


def _cpprun_chain():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


try:
    _cpprun_start_progress()
except Exception as error:  # progress stamps never stop a trainer
    import sys
    sys.stderr.write("cpprun: automatic progress stamps are off: %r\n" % (error,))
_cpprun_chain()
)PY";

}  // namespace

const std::string& pythonProgressModule() {
  static const std::string text = kModule;
  return text;
}

Status writePythonProgressModule(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return internalError("cannot create " + dir + ": " + ec.message());
  const std::string path = dir + "/sitecustomize.py";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << pythonProgressModule();
  out.close();
  if (!out) return internalError("cannot write " + path + ": " + std::strerror(errno));
  return Status::ok();
}

void addPythonProgress(std::map<std::string, std::string>& env, const std::string& dir,
                       std::chrono::milliseconds interval, const char* inherited_pythonpath) {
  auto set = env.find("PYTHONPATH");
  const std::string rest = set != env.end()                  ? set->second
                           : inherited_pythonpath != nullptr ? std::string(inherited_pythonpath)
                                                             : std::string();
  env["PYTHONPATH"] = rest.empty() ? dir : dir + ":" + rest;
  env[kPythonProgressVariable] = std::to_string(interval.count());
}

std::chrono::milliseconds pythonProgressInterval(std::chrono::milliseconds stall_timeout) {
  return std::clamp(stall_timeout / 10, std::chrono::milliseconds(50),
                    std::chrono::milliseconds(500));
}

}  // namespace cpprun::agent
