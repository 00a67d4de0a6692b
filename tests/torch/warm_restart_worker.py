"""Worker for tests/e2e/warm_restart_test.cc (--warm-restart, agent/processes/warm_start_launcher.h).
Run under cpprun (2 workers, --max-restarts >= 1), with PYTHON_EXEC set:

    warm_restart_worker.py facts OUT
        attempt 0: write OUT/facts_<attempt>_<rank>.json (what the process is: see facts()); then
        rank 1 exits 3: at once when OUT/exit-before-init exists (local rank 0 never gets its
        process group, so the warm process never gets its imports and attempt 1 starts cold),
        else after the gloo group is up and the warm process says ready; rank 0 waits in
        init_process_group or sleeps until it is stopped. Attempt 1: init gloo, let cpprun's
        import-record thread end (a cold start's under --warm-restart), write the facts,
        barrier; rank 1 prints a line to stdout and one to stderr and raises ValueError from
        fail_here() (main() carries torch's @record: the error file); rank 0 sleeps until
        stopped. The job fails, exit 1.
    warm_restart_worker.py ddp OUT
        a tiny DistributedDataParallel model (gloo); attempt 0 trains 3 steps, rank 0 writes
        OUT/checkpoint.pt, rank 1 exits 3; attempt 1 goes on from the checkpoint to step 6 and
        each rank writes OUT/ddp_<rank>.json (start step, parameter checksum, the module probes).
    warm_restart_worker.py faults OUT
        4 attempts (--max-restarts=3), each a different reason for a cold start: attempt 0 rank 1
        exits 3 at once (before any process group: the warm process never got its imports);
        attempt 1 rank 1 waits for the warm process to be ready, touches this file and exits 3;
        attempt 2 rank 1 waits for the second warm process to be ready, then for it to be killed
        (by the test), and exits 3; attempt 3 succeeds.
    warm_restart_worker.py threads OUT
        attempt 0 rank 1 waits until the warm process says it is unusable (its log) or is gone
        (the agent ends an unusable one), then exits 3; attempt 1 succeeds.
    warm_restart_worker.py plain OUT
        no torch: attempt 0 rank 1 exits 3, attempt 1 succeeds (--no-python runs).
    warm_restart_worker.py spare OUT
        one worker per node (hot spares): init gloo, all_reduce a 1 and print a line saying the
        attempt, the sum and whether torch was imported at start; attempt 0 then sleeps until
        stopped (the test kills a node), attempt 1 succeeds.

Every mode writes OUT/probe_<attempt>_<rank>.json: the RANK that the program's own module
(warm_restart_local.py, beside this file) and the installed one (cpprun_test_site_module, put
into a venv's site-packages by the test; absent otherwise) read at import. Every wait here is
bounded (WAIT_S); a bound that passes exits 9, naming it.
"""
_GLOBALS_AT_START = sorted(globals())
_TORCH_AT_START = "torch" in __import__("sys").modules  # documented: a warm worker has it

import ctypes
import json
import gc
import os
import random
import resource
import signal
import sys
import threading
import time

import warm_restart_local

try:
    import cpprun_test_site_module as site_module
except ImportError:
    site_module = None

WAIT_S = 60
MODE = sys.argv[1]
OUT = sys.argv[2]
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def write_json(name, value):
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as out:
        json.dump(value, out, indent=1, sort_keys=True)
    os.rename(path + ".tmp", path)


def give_up(what):
    sys.stderr.write("warm_restart_worker: gave up after %d s waiting for %s\n" % (WAIT_S, what))
    sys.stderr.flush()
    os._exit(9)


def exit_once_rank0_wrote(*names):
    """Rank 1 failing at once: first rank 0's files the test reads (the failure stops rank 0,
    which under load could otherwise be stopped before it wrote them)."""
    deadline = time.monotonic() + WAIT_S
    for name in names:
        while not os.path.exists(os.path.join(OUT, name % ATTEMPT)):
            if time.monotonic() > deadline:
                give_up("rank 0's " + name % ATTEMPT)
            time.sleep(0.01)
    sys.exit(3)


def warm_log():
    # The run's python folder is the first entry of PYTHONPATH (worker_wiring.h).
    return os.path.join(os.environ["PYTHONPATH"].split(":")[0], "cpprun_warm.log")


def warm_lines(word, count=1):
    """The first `count` lines of the warm log saying `word` ("ready", "unusable"), waited for."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            with open(warm_log()) as log:
                found = [line.strip() for line in log if ": %s" % word in line]
        except OSError:
            found = []
        if len(found) >= count:
            return found[:count]
        if time.monotonic() > deadline:
            give_up("%d '%s' line(s) in %s" % (count, word, warm_log()))
        time.sleep(0.05)


def gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stay_until_stopped():
    time.sleep(WAIT_S)
    give_up("being stopped by cpprun")


def facts():
    """What a worker process is, beyond what its program does: compared, warm against cold."""
    libc = ctypes.CDLL(None, use_errno=True)

    def prctl_int(option):
        value = ctypes.c_int(-1)
        libc.prctl(option, ctypes.byref(value), 0, 0, 0)
        return value.value

    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass  # the listing's own descriptor, closed by now
    signals = {}
    for number in sorted(signal.valid_signals()):
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(number)
        if callable(handler):
            handler = "%s.%s" % (getattr(handler, "__module__", "?"),
                                 getattr(handler, "__qualname__", "?"))
        signals[str(number)] = str(handler)
    status = {}
    with open("/proc/self/status") as text:
        for line in text:
            key, _, value = line.partition(":")
            if key.startswith(("Sig", "Shd", "Cap", "NoNewPrivs", "Seccomp", "Cpus_allowed_list",
                               "Mems_allowed_list", "Umask", "THP_enabled")):
                if key != "SigQ":
                    status[key] = value.strip()
    with open("/proc/self/stat") as text:
        stat = text.read().rsplit(")", 1)[1].split()
    umask = os.umask(0)
    os.umask(umask)
    limits = {name: resource.getrlimit(getattr(resource, name))
              for name in sorted(dir(resource)) if name.startswith("RLIMIT_")}
    streams = {}
    for name in ("stdin", "stdout", "stderr"):
        stream = getattr(sys, name)
        streams[name] = {
            "type": type(stream).__name__, "name": str(getattr(stream, "name", None)),
            "mode": getattr(stream, "mode", None), "encoding": stream.encoding,
            "errors": stream.errors, "line_buffering": stream.line_buffering,
            "write_through": stream.write_through, "buffer": type(stream.buffer).__name__,
            "fileno": stream.fileno(), "isatty": stream.isatty(),
            "is_dunder": stream is getattr(sys, "__%s__" % name)}
    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags)
             if not name.startswith("_") and name not in ("count", "index", "unbuffered")}

    def read(path):
        try:
            with open(path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError as error:
            return "unreadable: %s" % error.strerror

    import torch
    return {
        "environ": dict(os.environ),
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "executable": sys.executable,
        "path": sys.path,
        "cwd": os.getcwd(),
        "own_process_group": os.getpgid(0) == os.getpid(),
        "session_is_parents": os.getsid(0) == os.getsid(os.getppid()),
        "tty_nr": stat[4],
        "ppid": os.getppid(),
        "pdeathsig": prctl_int(2),  # PR_GET_PDEATHSIG
        "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
        "child_subreaper": prctl_int(37),  # PR_GET_CHILD_SUBREAPER
        "timer_slack": libc.prctl(30, 0, 0, 0, 0),  # PR_GET_TIMERSLACK
        "no_new_privs": libc.prctl(39, 0, 0, 0, 0),  # PR_GET_NO_NEW_PRIVS
        "comm": read("/proc/self/comm").strip(),
        "cmdline": read("/proc/self/cmdline").split("\0")[:-1],
        "exe": os.readlink("/proc/self/exe"),
        "oom_score_adj": read("/proc/self/oom_score_adj").strip(),
        "cgroup": read("/proc/self/cgroup"),
        "affinity": sorted(os.sched_getaffinity(0)),
        "scheduler": os.sched_getscheduler(0),
        "priority": os.getpriority(os.PRIO_PROCESS, 0),
        "fds": fds,
        "isatty": [os.isatty(fd) for fd in (0, 1, 2)],
        "fd0": os.readlink("/proc/self/fd/0"),
        "signals": signals,
        "proc_status": status,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "umask": umask,
        "limits": limits,
        "flags": flags,
        "dont_write_bytecode": sys.dont_write_bytecode,
        "warnoptions": sys.warnoptions,
        "xoptions": sys._xoptions,
        "streams": streams,
        "main_name": __name__,
        "main_file": __file__,
        "main_globals_at_start": _GLOBALS_AT_START,
        "main_spec": repr(globals().get("__spec__")),
        "main_package": repr(globals().get("__package__")),
        "main_cached": repr(globals().get("__cached__")),
        "main_loader": type(globals().get("__loader__")).__name__,
        "main_builtins": type(globals().get("__builtins__")).__name__,
        "main_module_is_this": sys.modules["__main__"].__dict__ is globals(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "on_main_thread": threading.current_thread() is threading.main_thread(),
        "meta_path": [type(f).__name__ if not isinstance(f, type) else f.__name__
                      for f in sys.meta_path],
        "torch_initial_seed": torch.initial_seed(),
        "torch_threads": torch.get_num_threads(),
        # Not compared (they differ between processes): each rank's must differ from the
        # other's, as two fresh interpreters' do.
        "random_bits": random.getrandbits(64),
        "hash_of_text": hash("cpprun"),
        # Documented differences (docs/supervision.md), checked apart.
        "gc_frozen": gc.get_freeze_count() > 0 if hasattr(gc, "get_freeze_count") else None,
    }


def write_probe():
    write_json("probe_%d_%d.json" % (ATTEMPT, RANK), {
        "local_module_rank": warm_restart_local.RANK_AT_IMPORT,
        "site_module_rank": getattr(site_module, "RANK_AT_IMPORT", "absent"),
        "torch_at_start": _TORCH_AT_START,
    })


def init_gloo():
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    return dist


def fail_here():
    raise ValueError("warm_restart_worker: rank %d failed on purpose in attempt %d" %
                     (RANK, ATTEMPT))


def let_record_end():
    # A cold start under --warm-restart: local rank 0 sends its imports to the warm process from
    # a thread of cpprun's sitecustomize (python_progress.cc), which ends once it has sent them.
    for thread in threading.enumerate():
        if thread.name == "cpprun-record":
            thread.join(WAIT_S)
            if thread.is_alive():
                give_up("cpprun's import-record thread to end")


def facts_mode():
    if ATTEMPT == 0:
        write_json("facts_%d_%d.json" % (ATTEMPT, RANK), facts())
        if RANK == 1 and os.path.exists(os.path.join(OUT, "exit-before-init")):
            exit_once_rank0_wrote("probe_%d_0.json", "facts_%d_0.json")
        init_gloo()
        if RANK == 1:
            warm_lines("ready")
            sys.exit(3)
        stay_until_stopped()
    dist = init_gloo()
    let_record_end()
    write_json("facts_%d_%d.json" % (ATTEMPT, RANK), facts())
    dist.barrier()  # both ranks' facts are written
    if RANK == 1:
        print("STDOUT-LINE from rank 1, attempt %d" % ATTEMPT)
        sys.stderr.write("STDERR-LINE from rank 1, attempt %d\n" % ATTEMPT)
        fail_here()
    stay_until_stopped()


def ddp_mode():
    import torch
    from torch.nn.parallel import DistributedDataParallel
    dist = init_gloo()

    def fresh_model():
        torch.manual_seed(1234)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def batch(step, rank):
        generator = torch.Generator().manual_seed(step * 10 + rank)  # each rank its own data
        x = torch.randn(16, 8, generator=generator)
        return x, x.sum(dim=1, keepdim=True)

    def checksum_of(module):
        return float(sum(p.detach().double().sum() for p in module.parameters()))

    def uninterrupted(steps):
        # The same training in one process, no restart: each step's gradient the mean of both
        # ranks' (what DDP's all-reduce makes).
        reference = fresh_model()
        sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
        for step in range(steps):
            sgd.zero_grad()
            for rank in range(2):
                x, y = batch(step, rank)
                (torch.nn.functional.mse_loss(reference(x), y) / 2).backward()
            sgd.step()
        return checksum_of(reference)

    model = DistributedDataParallel(fresh_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = os.path.join(OUT, "checkpoint.pt")
    start = 0
    if ATTEMPT > 0:
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    end = 3 if ATTEMPT == 0 else 6
    losses = []
    for step in range(start, end):
        x, y = batch(step, RANK)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients all-reduced by DDP
        optimizer.step()
        losses.append(loss.item())
    checksum = checksum_of(model)
    if ATTEMPT == 0:
        if RANK == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": end}, checkpoint + ".tmp")
            os.rename(checkpoint + ".tmp", checkpoint)
        dist.barrier()  # the checkpoint is written
        if RANK == 1:
            warm_lines("ready")
            sys.exit(3)
        stay_until_stopped()
    write_json("ddp_%d.json" % RANK, {"start": start, "end": end, "checksum": checksum,
                                      "uninterrupted": uninterrupted(end), "losses": losses})
    dist.barrier()


def faults_mode():
    if ATTEMPT == 0:
        if RANK == 1:  # before any process group: local rank 0 never sends its imports
            exit_once_rank0_wrote("probe_%d_0.json")
        stay_until_stopped()
    init_gloo().barrier()
    if RANK == 1 and ATTEMPT == 1:
        warm_lines("ready")
        stamp = os.stat(__file__).st_mtime_ns + 1000000000
        os.utime(__file__, ns=(stamp, stamp))  # the program changed on disk
        sys.exit(3)
    if RANK == 1 and ATTEMPT == 2:
        second = warm_lines("ready", 2)[1]  # "cpprun warm process PID: ready: ..."
        pid = int(second.split()[3].rstrip(":"))
        deadline = time.monotonic() + WAIT_S
        while not gone(pid):  # the test kills it
            if time.monotonic() > deadline:
                give_up("warm process %d to be killed" % pid)
            time.sleep(0.05)
        sys.exit(3)
    if ATTEMPT < 3:
        stay_until_stopped()


def warm_processes():
    """The agent's children that run cpprun_warm.py (the agent is this worker's parent)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open("/proc/%s/cmdline" % name, "rb") as cmdline:
                line = cmdline.read()
        except OSError:
            continue
        if int(fields[1]) == os.getppid() and fields[0] != "Z" and b"cpprun_warm.py" in line:
            found.append(int(name))
    return found


def threads_mode():
    init_gloo().barrier()
    if ATTEMPT == 0:
        if RANK == 1:
            # The warm process says it is unusable in its log, and the agent ends it once told.
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    with open(warm_log()) as log:
                        said = ": unusable" in log.read()
                except OSError:
                    said = False
                if said or not warm_processes():
                    break
                if time.monotonic() > deadline:
                    give_up("the warm process to be unusable")
                time.sleep(0.05)
            sys.exit(3)
        stay_until_stopped()


def plain_mode():
    if ATTEMPT == 0 and RANK == 1:
        exit_once_rank0_wrote("probe_%d_0.json")


def spare_mode():
    import torch
    dist = init_gloo()
    total = torch.ones(1)
    dist.all_reduce(total)
    print("spare mode: rank %d, attempt %d, torch at start %s, all_reduce %d" %
          (RANK, ATTEMPT, _TORCH_AT_START, int(total.item())), flush=True)
    if ATTEMPT == 0:
        stay_until_stopped()


def main():
    write_probe()
    {"facts": facts_mode, "ddp": ddp_mode, "faults": faults_mode, "threads": threads_mode,
     "plain": plain_mode, "spare": spare_mode}[MODE]()


if __name__ == "__main__":
    if MODE == "facts":
        from torch.distributed.elastic.multiprocessing.errors import record
        main = record(main)
    main()
