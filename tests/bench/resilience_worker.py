"""The 2-rank gloo worker of tests/bench/resilience_bench.py (torch 2.x, CPU), under any launcher.

Environment (set by the benchmark):
  RB_DIR   folder shared by every worker of one job: the event file `events` (one JSON line
           per event, appended with one write(2)) and the marker `faulted`
  RB_MODE  fail | hang | hang-unchanged | loss
  RB_API   cpprun | ft | none: how progress is reported (cpprun: examples/python/cpprun_progress.py
           on $CPPRUN_PROGRESS_FILE; ft: nvidia-resiliency-ext's RankMonitorClient heartbeats;
           none: no progress calls at all, the "unchanged trainer")
  RB_HEAVY 1: the heavy-import trainer: before `import torch` the script imports HEAVY_MODULES
           (real installed packages: torch's distributed, compiler and data stacks, numpy, sympy
           with sympy.physics and sympy.stats, networkx, triton, jinja2; 3.9-5.2 s in one fresh
           process on the 2-core development machine under load, ~3 s idle) as a real trainer
           does at its top, before init_process_group; RB_HEAVY_MODULES (comma-separated)
           replaces the list.

Each step is one gloo all_reduce followed by a progress report and 50 ms of sleep. A worker that
starts before `faulted` exists is in the first phase: at step 10 rank 1 creates `faulted` and
  fail            writes `fail` and exits 1;
  hang            writes `hang` and stops taking part (blocks forever on an Event); rank 0's next
                  all_reduce blocks in gloo (no sleep-only hang), and neither reports progress;
  hang-unchanged  the same, with RB_API=none;
  loss            nothing: the benchmark SIGKILLs one agent with its worker, then creates `faulted`.
The fault (fail, hang) waits until RB_HANG_AFTER s after the script's start and, with
RB_FAULT_GATE=1, until the marker `go` exists (the benchmark: once cpprun's warm process is ready).
A worker that starts once `faulted` exists runs 5 steps and exits 0, so the job ends by itself.
Events: start (first line of the script, before `import torch`), imported (`dur`: the script's
imports, heavy set and torch, in seconds), ready (process group up and one all_reduce done;
`rss_kib` and `pss_kib`: the worker's VmRSS and Pss then), fail, hang, done.
"""
import json
import os
import time

T_START = time.time()
DIR = os.environ["RB_DIR"]
MODE = os.environ["RB_MODE"]
API = os.environ.get("RB_API", "none")
RANK = int(os.environ.get("RANK", "-1"))
# Hang no earlier than this many seconds after the script's start (hang-unchanged: later than
# the stall timeout, so a launcher that counts from the worker's start cannot pass for one that
# saw the hang).
HANG_AFTER = float(os.environ.get("RB_HANG_AFTER", "0"))
# RB_FAULT_GATE=1: the fault waits for the benchmark's marker `go` too (cpprun --warm-restart:
# once its warm process is ready, as in a job that has run a while).
FAULT_GATE = os.environ.get("RB_FAULT_GATE") == "1"
HEAVY_MODULES = (
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor",
    "torch.distributed.tensor.parallel", "torch.distributed.checkpoint",
    "torch.distributed.pipelining", "torch._dynamo", "torch._inductor.compile_fx",
    "torch.utils.benchmark", "torch.utils.data", "numpy", "sympy", "sympy.physics.mechanics",
    "sympy.physics.quantum", "sympy.stats", "networkx", "triton", "jinja2")


def memory_kib():
    """(VmRSS, Pss) of this process in KiB; None where /proc does not say."""
    rss = pss = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def event(kind, t=None, **extra):
    line = json.dumps(dict({"ev": kind, "t": time.time() if t is None else t, "rank": RANK,
                            "pid": os.getpid(), "ppid": os.getppid(),
                            "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")}, **extra))
    fd = os.open(os.path.join(DIR, "events"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


event("start", T_START)
AFTER = os.path.exists(os.path.join(DIR, "faulted"))

import threading  # noqa: E402

T_IMPORTS = time.time()
if os.environ.get("RB_HEAVY") == "1":
    import importlib  # noqa: E402
    for name in [m for m in os.environ.get("RB_HEAVY_MODULES", "").split(",") if m] or \
            HEAVY_MODULES:
        importlib.import_module(name)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

event("imported", dur=time.time() - T_IMPORTS)
dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
RSS, PSS = memory_kib()
event("ready", rss_kib=RSS, pss_kib=PSS)

if API == "cpprun":
    from cpprun_progress import Progress
    progress = Progress()
    beat = progress.step
elif API == "ft":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()
    beat = lambda step: client.send_heartbeat()  # noqa: E731
else:
    beat = lambda step: None  # noqa: E731

step = 0
while True:
    dist.all_reduce(tensor)
    beat(step)
    if AFTER and step >= 5:
        break
    if not AFTER and step >= 10 and RANK == 1 and MODE != "loss" and \
            time.time() - T_START >= HANG_AFTER and \
            (not FAULT_GATE or os.path.exists(os.path.join(DIR, "go"))):
        os.close(os.open(os.path.join(DIR, "faulted"), os.O_WRONLY | os.O_CREAT, 0o644))
        if MODE == "fail":
            event("fail")
            os._exit(1)
        event("hang")
        threading.Event().wait()  # stops taking part: rank 0 blocks in gloo's all_reduce
    time.sleep(0.05)
    step += 1

if API == "ft":
    client.shutdown_workload_monitoring()
dist.destroy_process_group()
event("done")
