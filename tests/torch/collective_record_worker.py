"""Prints the collective record cpprun's sitecustomize keeps (CPPRUN_COLLECTIVE_FILE) after
collectives on the default group and on a subgroup, for hang_verdict_test:

    RECORD <rank> <phase> <the record's line>

A name bound before init_process_group (`from torch.distributed import all_reduce`) is wrapped
too: the module is wrapped as it is imported."""
import os

import torch
import torch.distributed as dist
from torch.distributed import all_reduce

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()


def record(phase):
    with open(os.environ["CPPRUN_COLLECTIVE_FILE"]) as f:
        print("RECORD %d %s %s" % (rank, phase, f.read().strip()), flush=True)


t = torch.ones(2)
all_reduce(t)
dist.broadcast(t, src=0)
record("world")
# A subgroup is named by its ranks (the same name on every rank).
groups = [dist.new_group([0, 1]), dist.new_group([1])]
dist.all_reduce(t, group=groups[0])
record("subgroup")
dist.all_gather_object([None, None], {"rank": rank})  # nested collectives count once
record("object")
dist.barrier()
record("barrier")
dist.destroy_process_group()
