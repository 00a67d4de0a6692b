"""The "hello world" of cluster DDP guides, run under cpprun (or torchrun) before a real job:
one line per rank with the host, the ranks, the device the rank would train on and every NCCL_*
and TORCH_NCCL_* variable it sees (torch 2.x reads TORCH_NCCL_ASYNC_ERROR_HANDLING, 1.x
NCCL_ASYNC_ERROR_HANDLING), after an all_reduce proves that the group formed.

    PYTHON_EXEC=/usr/bin/python3 cpprun --nproc-per-node=2 examples/python/hello.py

Backend: nccl when this rank has a GPU, gloo otherwise (--backend overrides).
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["nccl", "gloo"])
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend=backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()

    ones = torch.ones(1, device=device)
    dist.all_reduce(ones)
    nccl = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k.startswith(("NCCL_", "TORCH_NCCL_")))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"hello from rank {rank}/{world} local_rank {local_rank}/"
          f"{os.environ.get('LOCAL_WORLD_SIZE', '?')} node {os.environ.get('GROUP_RANK', '?')} "
          f"host {socket.gethostname()} device {device} ({name}) backend {backend} "
          f"all_reduce {int(ones.item())} NCCL: {nccl or '(none set)'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
