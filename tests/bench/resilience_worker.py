"""The 2-rank gloo worker of tests/bench/resilience_bench.py (torch 2.x, CPU), under any launcher.

Environment (set by the benchmark):
  RB_DIR   folder shared by every worker of one job: the event file `events` (one JSON line
           per event, appended with one write(2)) and the marker `faulted`
  RB_MODE  fail | hang | hang-unchanged | loss
  RB_API   cpprun | ft | none: how progress is reported (cpprun: examples/python/cpprun_progress.py
           on $CPPRUN_PROGRESS_FILE; ft: nvidia-resiliency-ext's RankMonitorClient heartbeats;
           none: no progress calls at all, the "unchanged trainer")

Each step is one gloo all_reduce followed by a progress report and 50 ms of sleep. A worker that
starts before `faulted` exists is in the first phase: at step 10 rank 1 creates `faulted` and
  fail            writes `fail` and exits 1;
  hang            writes `hang` and stops taking part (blocks forever on an Event); rank 0's next
                  all_reduce blocks in gloo (no sleep-only hang), and neither reports progress;
  hang-unchanged  the same, with RB_API=none;
  loss            nothing: the benchmark SIGKILLs one agent with its worker, then creates `faulted`.
A worker that starts once `faulted` exists runs 5 steps and exits 0, so the job ends by itself.
Events: start (first line of the script, before `import torch`), ready (process group up and
one all_reduce done), fail, hang, done.
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


def event(kind, t=None):
    line = json.dumps({"ev": kind, "t": time.time() if t is None else t, "rank": RANK,
                       "pid": os.getpid(), "ppid": os.getppid(),
                       "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")})
    fd = os.open(os.path.join(DIR, "events"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


event("start", T_START)
AFTER = os.path.exists(os.path.join(DIR, "faulted"))

import threading  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
event("ready")

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
            time.time() - T_START >= HANG_AFTER:
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
