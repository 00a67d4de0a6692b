#include "agent/supervision/python_progress.h"

#include <algorithm>
#include <filesystem>

#include "common/system.h"

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


def _cpprun_track_collectives():
    # The collective record (agent/supervision/stall_verdict.h): what this rank waits in, so a
    # hang's culprit can be told from its victims. torch.distributed's collectives are wrapped
    # as the package is imported (before any program code can bind them), each writing
    # "in <op> <group> <seq>" before the call and "after ..." when it returns: two pwrite(2)s.
    import os
    import sys
    path = os.environ.get("CPPRUN_COLLECTIVE_FILE")
    if not path:
        return
    names = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
             "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
             "reduce", "barrier", "monitored_barrier", "all_to_all", "all_to_all_single",
             "gather", "scatter", "all_gather_object", "broadcast_object_list",
             "gather_object", "scatter_object_list", "all_reduce_coalesced",
             "all_gather_coalesced")

    def patch(dist):
        import functools
        import inspect
        import zlib
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is None:
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        pwrite = os.pwrite
        seqs = {}
        names_of = {}
        depth = [0]

        def group_name(group):
            # "world" for the default group; another is named by its ranks, the same on every
            # rank whatever order the groups were made in.
            if group is None:
                return "world"
            known = names_of.get(id(group))
            if known is not None:
                return known[0]
            name = None
            try:
                if group is c10d.GroupMember.WORLD or group is c10d._get_default_group():
                    name = "world"
            except Exception:
                pass
            if name is None:
                try:
                    ranks = c10d.get_process_group_ranks(group)
                except Exception:
                    ranks = sorted(getattr(c10d, "_pg_group_ranks", {}).get(group, {}))
                name = "g%08x.%d" % (zlib.crc32(repr(list(ranks)).encode()), len(ranks))
            names_of[id(group)] = (name, group)  # the group is kept: its id stays its own
            return name

        def wrap(fn, op):
            try:
                params = list(inspect.signature(fn).parameters)
                at = params.index("group")
            except (TypeError, ValueError):
                at = None

            @functools.wraps(fn)
            def collective(*args, **kwargs):
                if depth[0]:
                    return fn(*args, **kwargs)
                group = kwargs.get("group")
                if group is None and at is not None and at < len(args):
                    group = args[at]
                name = group_name(group)
                n = seqs.get(name, 0) + 1
                seqs[name] = n
                tail = " %s %s %d" % (op, name, n)
                pwrite(fd, ("in" + tail).ljust(127).encode() + b"\n", 0)
                depth[0] += 1
                try:
                    result = fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
                # Only a return is "after": a collective that raised (a peer torn down) leaves
                # the rank recorded in it, where it waited.
                pwrite(fd, ("after" + tail).ljust(127).encode() + b"\n", 0)
                return result
            return collective

        for name in names:
            fn = getattr(c10d, name, None)
            if fn is None or not callable(fn):
                continue
            wrapped = wrap(fn, name.lstrip("_"))
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, wrapped)

        # DistributedDataParallel all-reduces the gradients inside backward, in C++: no Python
        # call to wrap. Each forward that will sync begins "ddp_step #n" (group "ddp"), in which
        # the rank stays until its next forward, so a rank that never reached step n's forward is
        # behind the ranks blocked in its backward. Wrapped once the program has its process
        # group (torch is fully imported by then).
        def wrap_ddp():
            from torch.nn.parallel import DistributedDataParallel as ddp
            forward = ddp.forward
            if getattr(forward, "cpprun_ddp_steps", False):
                return  # a second init_process_group: wrapped once
            steps = [0]

            @functools.wraps(forward)
            def ddp_forward(self, *args, **kwargs):
                if getattr(self, "require_backward_grad_sync", True) and not depth[0]:
                    steps[0] += 1
                    pwrite(fd, ("in ddp_step ddp %d" % steps[0]).ljust(127).encode() + b"\n", 0)
                return forward(self, *args, **kwargs)
            ddp_forward.cpprun_ddp_steps = True
            ddp.forward = ddp_forward

        init = getattr(c10d, "init_process_group", None)
        if init is not None:
            @functools.wraps(init)
            def init_process_group(*args, **kwargs):
                result = init(*args, **kwargs)
                try:
                    wrap_ddp()
                except Exception as error:
                    sys.stderr.write("cpprun: DDP steps are not recorded: %r\n" % (error,))
                return result
            c10d.init_process_group = init_process_group
            if getattr(dist, "init_process_group", None) is init:
                dist.init_process_group = init_process_group

    class Finder:
        def find_spec(self, name, search_path, target=None):
            if name != "torch.distributed":
                return None
            import importlib.machinery
            spec = importlib.machinery.PathFinder.find_spec(name, search_path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                try:
                    sys.meta_path.remove(finder)
                except ValueError:
                    pass
                run(module)
                try:
                    patch(module)
                except Exception as error:  # the record never stops a trainer
                    sys.stderr.write("cpprun: collective records are off: %r\n" % (error,))

            spec.loader.exec_module = exec_module
            return spec

    loaded = sys.modules.get("torch.distributed")
    if loaded is not None:  # a warm-started worker (warm_start_launcher.h): imported already
        patch(loaded)
        return
    finder = Finder()
    sys.meta_path.insert(0, finder)


def _cpprun_record_imports():
    # --warm-restart (agent/processes/warm_start_launcher.h): once torch.distributed's default
    # group is up, local rank 0 sends the names of its modules to the node's warm process, which
    # imports those of installed packages for the next attempt's workers.
    import os
    name = os.environ.pop("CPPRUN_WARM_RECORD", None)
    if not name or os.environ.get("LOCAL_RANK") != "0":
        return
    import sys
    import threading
    import time

    def record():
        while True:
            time.sleep(0.05)
            initialized = getattr(sys.modules.get("torch.distributed"), "is_initialized", None)
            try:
                if initialized is not None and initialized():
                    break
            except BaseException:
                pass
        try:
            import json
            import socket
            names = [n for n, m in list(sys.modules.items()) if m is not None]
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
                s.settimeout(5)
                s.connect("\0" + name)
                s.send(json.dumps(names).encode())
        except BaseException:
            pass  # the record never stops a trainer

    threading.Thread(target=record, name="cpprun-record", daemon=True).start()


def _cpprun_worker_start():
    # What every worker runs at start: at interpreter start for a cold one, after the fork for a
    # warm one (whose warm process ran this file without a worker's environment).
    import sys
    for start, what in ((_cpprun_track_collectives, "collective records are off"),
                        (_cpprun_start_progress, "automatic progress stamps are off"),
                        (_cpprun_record_imports, "the warm restart's import record is off")):
        try:
            start()
        except Exception as error:  # none of these ever stops a trainer
            sys.stderr.write("cpprun: %s: %r\n" % (what, error))


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


_cpprun_worker_start()
_cpprun_chain()
)PY";

}  // namespace

std::string pythonModuleDirectory(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "python").lexically_normal().string();
}

const std::string& pythonProgressModule() {
  static const std::string text = kModule;
  return text;
}

Status writePythonProgressModule(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return internalError("cannot create " + dir + ": " + ec.message());
  // Written whole and renamed into place: every attempt writes it, and a Python starting
  // meanwhile (a worker of another node's attempt sharing the folder, the warm process) reads
  // either the old text or the new, never half of one.
  // Whole, and left as it is when unchanged: every attempt writes it, a Python starting
  // meanwhile must read either text, and the warm process takes a changed file for a changed
  // package (agent/processes/warm_start_launcher.h).
  if (Status s = writeFileWhole(dir + "/sitecustomize.py", pythonProgressModule()); !s.isOk()) {
    return internalError("cannot write " + dir + "/sitecustomize.py: " + s.message());
  }
  return Status::ok();
}

void addPythonProgress(std::map<std::string, std::string>& env, const std::string& dir,
                       std::chrono::milliseconds interval, const char* inherited_pythonpath) {
  auto set = env.find("PYTHONPATH");
  const std::string rest = set != env.end()                  ? set->second
                           : inherited_pythonpath != nullptr ? std::string(inherited_pythonpath)
                                                             : std::string();
  env["PYTHONPATH"] = rest.empty() ? dir : dir + ":" + rest;
  if (interval.count() > 0) env[kPythonProgressVariable] = std::to_string(interval.count());
}

std::chrono::milliseconds pythonProgressInterval(std::chrono::milliseconds stall_timeout) {
  return std::clamp(stall_timeout / 10, std::chrono::milliseconds(50),
                    std::chrono::milliseconds(500));
}

}  // namespace cpprun::agent
