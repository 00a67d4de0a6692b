#!/usr/bin/env python3
"""The cost of cpprun's collective record (issue 35): torch.distributed collectives as cpprun's
sitecustomize wraps them (two pwrite(2)s of the record per call) beside the same collectives
unwrapped, in the same processes, in one run.

    /opt/cpprun/torch2/bin/python tests/bench/collective_record_bench.py [--cpprun build/cpprun]
        [--ranks 2] [--calls 20000] [--blocks 10] [--python /opt/cpprun/torch2/bin/python]

cpprun starts --ranks gloo workers with --stall-timeout (so the sitecustomize is in); each worker
times --blocks alternating blocks of --calls all_reduce calls of one float through
torch.distributed.all_reduce (wrapped) and through its __wrapped__ (the original), and the same
for barrier. Rank 0 prints the median microseconds per call of each and
`RESULT collective_record_<op>_us <wrapped> us peer=<original> ratio=<wrapped/original>`, and
`RESULT collective_record_<op>_overhead_us <wrapped - original> us`.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

WORKER = textwrap.dedent('''
    import os, statistics, sys, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    calls, blocks = int(sys.argv[1]), int(sys.argv[2])
    t = torch.ones(1)
    def timed(fn, *args):
        dist.barrier()
        began = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        return (time.perf_counter() - began) / calls * 1e6
    wrapped_ar, original_ar = dist.all_reduce, getattr(dist.all_reduce, "__wrapped__", None)
    wrapped_b, original_b = dist.barrier, getattr(dist.barrier, "__wrapped__", None)
    if original_ar is None or original_b is None:
        sys.exit("the collectives are not wrapped: cpprun's sitecustomize is not in")
    rows = {"all_reduce": ([], []), "barrier": ([], [])}
    for _ in range(blocks):
        rows["all_reduce"][0].append(timed(wrapped_ar, t))
        rows["all_reduce"][1].append(timed(original_ar, t))
        rows["barrier"][0].append(timed(wrapped_b))
        rows["barrier"][1].append(timed(original_b))
    if dist.get_rank() == 0:
        for op, (w, o) in rows.items():
            print("MEDIANS %s %.3f %.3f" % (op, statistics.median(w), statistics.median(o)), flush=True)
    dist.destroy_process_group()
''')


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpprun", default=os.path.join(root, "build", "cpprun"))
    p.add_argument("--python", default=os.environ.get("CPPRUN_TORCH2_VENV", "/opt/cpprun/torch2")
                   + "/bin/python")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--timeout", type=int, default=600)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        worker = os.path.join(d, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, PYTHON_EXEC=a.python, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        run = subprocess.run(
            [a.cpprun, "--nproc-per-node=%d" % a.ranks, "--stall-timeout=600",
             "--log-dir=" + os.path.join(d, "logs"), worker, str(a.calls), str(a.blocks)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=a.timeout)
        medians = [line.split("MEDIANS ", 1)[1].split() for line in run.stdout.splitlines()
                   if "MEDIANS " in line]
        if run.returncode != 0 or not medians:
            sys.stderr.write(run.stdout)
            sys.exit("collective_record_bench: the job failed (exit %d)" % run.returncode)
    print("%d gloo ranks on loopback, %d calls x %d alternating blocks, medians of the blocks"
          % (a.ranks, a.calls, a.blocks))
    print("%-12s %14s %14s %12s" % ("op", "wrapped us", "original us", "overhead us"))
    for op, wrapped, original in medians:
        w, o = float(wrapped), float(original)
        print("%-12s %14.3f %14.3f %12.3f" % (op, w, o, w - o))
        print("RESULT collective_record_%s_us %.3f us peer=%.3f ratio=%.3f" % (op, w, o, w / o))
        print("RESULT collective_record_%s_overhead_us %.3f us" % (op, w - o))


if __name__ == "__main__":
    main()
