"""One rank of a two-process gloo job that bootstraps from a TCPStore through env://.

Run by tests/rendezvous/torch_interop_test.cc with Debian's /usr/bin/python3, as torchrun
would run a worker: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK in the
environment; with TORCHELASTIC_USE_AGENT_STORE=True every rank is a client of the store at
MASTER_ADDR:MASTER_PORT (the agent's: cpprun's server in the test).

Does init_process_group("gloo", init_method="env://"), an all_reduce of [rank + 1.0] (3.0 for
two ranks), a barrier and destroy_process_group. Prints "rank R world W all_reduce X" and
exits 0, or prints "FAIL <why>" and exits 1. With --fail-first-attempt, rank 1 exits 3 after
its all_reduce while TORCHELASTIC_RESTART_COUNT is 0 (for a launcher's restart), printing
"rank 1 fails attempt 0".
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    fail_first_attempt = "--fail-first-attempt" in sys.argv[1:]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    if dist.get_rank() != rank or dist.get_world_size() != world:
        print(f"FAIL process group says rank {dist.get_rank()} of {dist.get_world_size()}, "
              f"environment says {rank} of {world}", flush=True)
        sys.exit(1)

    tensor = torch.tensor([rank + 1.0])
    dist.all_reduce(tensor)
    total = tensor.item()
    print(f"rank {rank} world {world} all_reduce {total}", flush=True)
    expected = world * (world + 1) / 2
    if total != expected:
        print(f"FAIL all_reduce gave {total}, expected {expected}", flush=True)
        sys.exit(1)

    if fail_first_attempt and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        print("rank 1 fails attempt 0", flush=True)
        os._exit(3)  # at once: no barrier, no teardown, as a crashed worker would
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
