"""A PyTorch worker written for torchrun: env:// rendezvous through the agent's store, one
gloo all_reduce, one line of output. Run two of these against `cpprun-store` (see demo.sh)."""
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    # One write per line, so lines of concurrent workers never interleave.
    sys.stdout.write(f"{socket.gethostname()} rank {rank}/{world}: all_reduce -> {t.item():g} "
                     f"(expected {expected:g})\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    if t.item() != expected:
        raise SystemExit(f"rank {rank}: wrong all_reduce result {t.item()}")


if __name__ == "__main__":
    main()
