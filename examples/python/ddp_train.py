"""A PyTorch DDP script written for torchrun, run unchanged by cpprun:

    PYTHON_EXEC=/usr/bin/python3 cpprun --nproc-per-node=2 examples/python/ddp_train.py

env:// init (MASTER_ADDR/MASTER_PORT: the agent's store), DistributedSampler-style sharding,
DDP on gloo (CPU), an all_reduce check, destroy_process_group. With --out DIR each rank writes
result-<rank>.json, its interpreter included (cpprun's integration tests read them). The bundled MNIST trainer comes
with a later stage; this is the smallest real DDP job.

--hold-first-attempt, for elastic tests: in the job's first attempt (TORCHELASTIC_RESTART_COUNT
0) every rank prints "rank R of W: holding" once the group formed and then waits to be stopped,
so that a test can take a node away mid-job; later attempts train as usual."""
import argparse
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="directory for result-<rank>.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hold-first-attempt", action="store_true")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo", init_method="env://")
    rank = dist.get_rank()
    world = dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if args.hold_first_attempt and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        print(f"rank {rank} of {world}: holding", flush=True)
        signal.pause()  # until the launcher stops this attempt

    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234)
    x_all = torch.randn(256, 8, generator=gen)
    y_all = x_all.sum(dim=1, keepdim=True)
    shard = slice(rank, None, world)  # DistributedSampler's interleaved split
    x, y = x_all[shard], y_all[shard]
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    dist.barrier()
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    expected = world * (world + 1) / 2
    if t.item() != expected:
        raise RuntimeError(f"all_reduce gave {t.item()}, expected {expected}")
    if args.out:
        with open(os.path.join(args.out, f"result-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world, "all_reduce": float(t.item()),
                       "loss": float(loss.item()), "param_checksum": round(checksum, 9),
                       "executable": sys.executable}, f)
    print(f"rank {rank}: all_reduce={t.item()} loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
