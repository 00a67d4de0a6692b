"""A DDP script written the Slurm-native way, as cluster guides teach it for
`srun --ntasks-per-node=<GPUs> python slurm_native.py`: the rank comes from SLURM_PROCID, the
world size from SLURM_NTASKS, the local rank is computed from the rank and the tasks (GPUs) per
node, and MASTER_ADDR is the first host of the job's node list (parsed here, no scontrol).

It runs unchanged as a cpprun worker (one agent per node, `srun --ntasks-per-node=1 cpprun
--nproc-per-node=gpu slurm_native.py`): inside a Slurm job cpprun rewrites each worker's
SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, ... to describe the worker,
and its store runs on the first host of the step's node list, at the MASTER_PORT it sets.

--out FILE writes what this rank saw as JSON ("{rank}" in FILE becomes the rank).
"""
import argparse
import json
import os
import re
import socket

import torch
import torch.distributed as dist


def first_host(nodelist):
    """The first host of a Slurm hostlist: "gpu[07-09,12],cpu1" -> "gpu07"."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()

    rank = int(os.environ["SLURM_PROCID"])
    world_size = int(os.environ["SLURM_NTASKS"])
    if torch.cuda.is_available():
        gpus_per_node = torch.cuda.device_count()
    else:
        gpus_per_node = int(os.environ["SLURM_NTASKS_PER_NODE"])
    local_rank = rank - gpus_per_node * (rank // gpus_per_node)

    os.environ["MASTER_ADDR"] = first_host(os.environ["SLURM_JOB_NODELIST"])
    os.environ.setdefault("MASTER_PORT", "29500")

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size)

    rank_sum = torch.tensor([rank], device=device)
    dist.all_reduce(rank_sum)
    print(f"rank {rank}/{world_size} local_rank {local_rank} host {socket.gethostname()} "
          f"node {os.environ.get('SLURMD_NODENAME', '?')} master "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} sum of ranks "
          f"{int(rank_sum.item())}", flush=True)
    if args.out:
        with open(args.out.replace("{rank}", str(rank)), "w") as f:
            json.dump({"rank": rank, "world_size": world_size, "local_rank": local_rank,
                       "master_addr": os.environ["MASTER_ADDR"],
                       "node": os.environ.get("SLURMD_NODENAME"),
                       "rank_sum": int(rank_sum.item())}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
