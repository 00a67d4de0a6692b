"""The 4-rank gloo worker of tests/bench/hang_culprit_bench.py (torch 2.x, CPU), under any launcher.

Environment (set by the benchmark):
  HC_STAMPS   file every worker appends its wall-clock stamps to, one line per stamp, written
              with one write(2): "<kind> <time.time()> <rank>", kind start | ready | hang
  HC_CULPRIT  the rank that stops taking part (default 2)
  HC_HANG_AT  the step at which it does (default 10)
  HC_API      none | ft | cpprun: how progress is reported. none: no progress call at all (the
              unchanged trainer; cpprun's sitecustomize stamps progress and records collectives
              by itself); ft: nvidia-resiliency-ext's RankMonitorClient heartbeats, one per step
              (ft_launcher sees no hang without them; as tests/bench/resilience_worker.py does);
              cpprun: examples/python/cpprun_progress.py on $CPPRUN_PROGRESS_FILE, one per step

Each step is one gloo all_reduce of a small tensor, the progress report, then 50 ms of sleep. In
the first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), at step HC_HANG_AT the culprit appends
its `hang` stamp and stops taking part (time.sleep, for an hour at a time) while every other rank
blocks in gloo's next all_reduce. A later attempt runs 5 steps and exits 0.
"""
import os
import time

T_START = time.time()
STAMPS = os.environ["HC_STAMPS"]
API = os.environ.get("HC_API", "none")
CULPRIT = int(os.environ.get("HC_CULPRIT", "2"))
HANG_AT = int(os.environ.get("HC_HANG_AT", "10"))
RANK = int(os.environ.get("RANK", "-1"))
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0")


def stamp(kind, t=None):
    line = f"{kind} {time.time() if t is None else t:.6f} {RANK}\n"
    fd = os.open(STAMPS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


stamp("start", T_START)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
tensor = torch.ones(4)
dist.all_reduce(tensor)
stamp("ready")

if API == "ft":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()
    beat = lambda step: client.send_heartbeat()  # noqa: E731
elif API == "cpprun":
    from cpprun_progress import Progress
    progress = Progress()
    beat = progress.step
else:
    beat = lambda step: None  # noqa: E731

step = 0
while True:
    dist.all_reduce(tensor)
    beat(step)
    if not FIRST_ATTEMPT and step >= 5:
        break
    if FIRST_ATTEMPT and step == HANG_AT and RANK == CULPRIT:
        stamp("hang")
        while True:  # stops taking part; the others block in the next all_reduce
            time.sleep(3600)
    time.sleep(0.05)
    step += 1

if API == "ft":
    client.shutdown_workload_monitoring()
dist.destroy_process_group()
