"""A torch.distributed (gloo) trainer with no progress calls at all, for the automatic progress
stamps of --python-progress (agent/supervision/python_progress.h). Run under cpprun with PYTHON_EXEC set:

    collective_hang_worker.py hang-rank R [STEPS]   STEPS all-reduces; then, in the first attempt
                                                   only (TORCHELASTIC_RESTART_COUNT 0), rank R
                                                   stops taking part (sleeps) and every other rank
                                                   blocks in the next all_reduce; a later attempt
                                                   finishes
    collective_hang_worker.py CULPRIT R [STEPS]      STEPS all-reduces, then in the first attempt
                                                   rank R is the culprit of a hang and every other
                                                   rank blocks in the next all_reduce; CULPRIT:
                                                   sleep-rank (time.sleep), read-rank (a blocking
                                                   read of a pipe), early-rank (leaves its loop a
                                                   step early and blocks in its end-of-training
                                                   work), desync-rank (a broadcast where the
                                                   others all_reduce), stop-rank (enters the
                                                   all_reduce, then is stopped by SIGSTOP: every
                                                   rank waits in the same collective, no culprit)
    collective_hang_worker.py ddp-sleep-rank R      a DistributedDataParallel model: at step 3 of the
                                                   first attempt rank R sleeps before its forward,
                                                   the others block in backward's all-reduce
    collective_hang_worker.py busy SECONDS         every rank spins in pure Python for SECONDS
                                                   (no call into C longer than microseconds),
                                                   then one all_reduce, and exits 0

Prints "HANG_AT <time.time()>" just before the hang (flushed), "DONE" at a clean end.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
tensor = torch.ones(4)
mode = sys.argv[1]
if mode == "hang-rank":
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
        dist.all_reduce(tensor)
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        print(f"HANG_AT {time.time():.6f}", flush=True)
        if dist.get_rank() == int(sys.argv[2]):
            while True:
                time.sleep(3600)
        dist.all_reduce(tensor)  # the other rank never comes: blocked in gloo
elif mode in ("sleep-rank", "read-rank", "early-rank", "desync-rank", "stop-rank"):
    culprit = int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    early = mode == "early-rank" and first_attempt and dist.get_rank() == culprit
    for _ in range(steps - 1 if early else steps):
        dist.all_reduce(tensor)
    if first_attempt:
        if mode != "stop-rank":
            print(f"HANG_AT {time.time():.6f}", flush=True)
        if dist.get_rank() == culprit:
            if mode == "sleep-rank":
                time.sleep(3600)
            elif mode == "read-rank":
                never_written, keep = os.pipe()
                os.read(never_written, 1)
            elif mode == "early-rank":
                # Leaves the loop a step early and goes on to its end-of-training work (here a
                # wait for a file nobody writes), holding its gloo connections open.
                never_written, keep = os.pipe()
                os.read(never_written, 1)
            elif mode == "desync-rank":
                dist.broadcast(torch.ones(1000), src=culprit)
            elif mode == "stop-rank":
                # Enters all_reduce #4 first and is stopped (SIGSTOP) inside it, as a rank whose
                # device or link died would be; the others enter it after, and wait.
                if os.fork() == 0:
                    time.sleep(0.3)
                    os.kill(os.getppid(), 19)
                    print(f"HANG_AT {time.time():.6f}", flush=True)
                    os._exit(0)
                dist.all_reduce(tensor)
        else:
            if mode == "stop-rank":
                time.sleep(1.0)  # after the culprit entered the collective and was stopped
            dist.all_reduce(tensor)  # the culprit never comes: blocked in gloo
elif mode == "ddp-sleep-rank":
    # DistributedDataParallel: its gradient all-reduce runs inside backward (C++); at step 3 of
    # the first attempt rank R sleeps before its forward and the others block in backward.
    culprit = int(sys.argv[2])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for step in range(5):
        if first_attempt and step == 3:
            print(f"HANG_AT {time.time():.6f}", flush=True)
            if dist.get_rank() == culprit:
                time.sleep(3600)
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
elif mode == "busy":
    end = time.time() + float(sys.argv[2])
    spins = 0
    while time.time() < end:
        spins += 1
    dist.all_reduce(tensor)
else:
    sys.exit(f"unknown mode {mode}")
dist.destroy_process_group()
print("DONE", flush=True)
