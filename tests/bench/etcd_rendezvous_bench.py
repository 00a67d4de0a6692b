"""etcd_rendezvous_bench: how long N cpprun agents take to meet and start their workers on the
etcd backend (--rdzv-backend etcd-v2, a 3-member etcd cluster this benchmark starts on loopback)
against cpprun's c10d path (--rdzv-backend c10d, the first agent serves the store), side by side
in one run.

    /usr/bin/python3 tests/bench/etcd_rendezvous_bench.py --cpprun build/cpprun \\
        --worker build/tests/bench/cpprun_bench_worker [--agents 1,8,64,256] [--runs 3] \\
        [--timeout 180] [--etcd /usr/bin/etcd] [--members 3]

Every agent is a separate process on this machine, as on N nodes, with one trivial worker
(cpprun_bench_worker started DIR: it writes its CLOCK_MONOTONIC start time and exits).
etcd:  `cpprun --nnodes N --nproc-per-node 1 --rdzv-backend etcd-v2 --rdzv-endpoint E1,E2,E3
        --rdzv-id bench-<n>-<rep> --no-python WORKER started DIR` (a fresh run id per run, so
        runs never share keys).
c10d:  `cpprun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P
        --rdzv-id bench --no-python WORKER started DIR`.
The etcd members run with --heartbeat-interval 50 --election-timeout 500 (as the tests'
EtcdCluster) and fsync as usual: every etcd write is a raft commit to disk.

Figures per N, median of --runs (the two variants alternate within each repetition):
  ready  from the first agent's spawn to the last worker's start (the slowest agent ready)
  total  from the first agent's spawn until every agent has exited
One line per figure: RESULT etcd_rdzv_<figure>_n<N> <etcd ms> ms peer=<c10d ms>
ratio=<etcd/c10d> (ratio > 1: etcd is slower). The issue's target (256 agents ready in under
1.5 s on etcd) is printed as information.

Bounded: a run still going after --timeout is killed (SIGTERM, 5 s, SIGKILL, by PID) and counted
as failed; the etcd members are SIGKILLed by PID at the end (and carry no state: their data dirs
are temporary). This process is a child subreaper: whatever an agent leaves behind comes back to
it, is reported, killed and reaped. Exit status 1 when a run failed, 2 on a bad flag.
"""

import argparse
import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rendezvous_bench import (PR_SET_CHILD_SUBREAPER, free_port, parse_list,  # noqa: E402
                              spawn, stop_failed_run, wait_all)
from rendezvous_bench import reap_leftovers as shared_reap_leftovers  # noqa: E402

KEEP = set()  # our own children that are not leftovers: the etcd members


def reap_leftovers() -> int:
    """Kills and reaps every process re-parented to us but the etcd members."""
    return shared_reap_leftovers(KEEP)


class EtcdCluster:
    """`members` etcd processes on loopback, each with a temporary data dir; kill() ends them
    by PID."""

    def __init__(self, etcd, members, timeout):
        self.dir = tempfile.mkdtemp(prefix="etcd-bench-")
        self.procs = []
        ports = [(free_port(), free_port()) for _ in range(members)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        self.endpoints = [f"127.0.0.1:{c}" for c, _ in ports]
        for i, (client, peer) in enumerate(ports):
            log = open(os.path.join(self.dir, f"m{i}.log"), "wb")
            self.procs.append(subprocess.Popen(
                [etcd, f"--name=m{i}", f"--data-dir={self.dir}/m{i}",
                 f"--listen-client-urls=http://127.0.0.1:{client}",
                 f"--advertise-client-urls=http://127.0.0.1:{client}",
                 f"--listen-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-cluster={cluster}", "--initial-cluster-state=new",
                 f"--initial-cluster-token=bench-{os.getpid()}", "--heartbeat-interval=50",
                 "--election-timeout=500"], stdout=log, stderr=log, stdin=subprocess.DEVNULL))
            log.close()
            KEEP.add(self.procs[-1].pid)
        deadline = time.monotonic() + timeout
        for e in self.endpoints:
            while True:
                try:
                    with urllib.request.urlopen(f"http://{e}/health", timeout=1) as r:
                        if b'"true"' in r.read():
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"etcd member at {e} not healthy within {timeout} s")
                time.sleep(0.05)

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def agent_command(kind, args, n, endpoint, run_id, run_dir):
    common = [args.cpprun, f"--nnodes={n}", "--nproc-per-node=1"]
    tail = ["--no-python", args.worker, "started", run_dir]
    if kind == "etcd":
        return common + ["--rdzv-backend=etcd-v2", f"--rdzv-endpoint={endpoint}",
                         f"--rdzv-id={run_id}"] + tail
    return common + ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                     "--rdzv-id=bench"] + tail


def one_run(kind, args, n, etcd_endpoints, rep):
    """Returns (ready_ms, total_ms) or None when the run failed."""
    run_dir = tempfile.mkdtemp(prefix=f"etcd-rdzv-bench-{kind}-")
    endpoint = ",".join(etcd_endpoints) if kind == "etcd" else f"127.0.0.1:{free_port()}"
    run_id = f"bench-{os.getpid()}-{n}-{rep}"
    env = dict(os.environ, OMP_NUM_THREADS="1", NCCL_SOCKET_IFNAME="lo")
    procs = []
    ok = True
    try:
        t0 = time.monotonic_ns()
        for rank in range(n):
            procs.append(spawn(agent_command(kind, args, n, endpoint, run_id, run_dir), env,
                               os.path.join(run_dir, f"agent-{rank}.log")))
        codes = wait_all(procs, args.timeout)
        t_end = time.monotonic_ns()
        if len(codes) < n or any(c != 0 for c in codes.values()):
            ok = False
            stop_failed_run(kind, n, procs, codes, run_dir, shown=2)
            reap_leftovers()
            return None
        starts = []
        for rank in range(n):
            path = os.path.join(run_dir, f"start.{rank}")
            if not os.path.exists(path):
                sys.stderr.write(f"{kind} n={n}: rank {rank} never started\n")
                return None
            starts.append(int(open(path).read()))
        left = reap_leftovers()
        if left:
            sys.stderr.write(f"{kind} n={n}: {left} process(es) left behind, killed\n")
            return None
        return ((max(starts) - t0) / 1e6, (t_end - t0) / 1e6)
    finally:
        for _, pfd in procs:
            os.close(pfd)
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpprun", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--etcd", default="/usr/bin/etcd")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--agents", default="1,8,64,256")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args()
    try:
        agents = sorted(set(parse_list(args.agents)))
    except ValueError:
        parser.error("--agents takes comma-separated integers")
    if not os.access(args.etcd, os.X_OK):
        sys.stderr.write(f"etcd_rendezvous_bench: no etcd at {args.etcd} (Debian's etcd-server; "
                         "pass --etcd)\n")
        return 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    cluster = EtcdCluster(args.etcd, args.members, 30)
    failed = False
    rows = []
    try:
        for n in agents:
            kinds = ["etcd", "c10d"]
            results = {k: [] for k in kinds}
            for rep in range(args.runs):
                order = kinds[rep % 2:] + kinds[:rep % 2]
                for kind in order:
                    r = one_run(kind, args, n, cluster.endpoints, rep)
                    if r is None:
                        failed = True
                    else:
                        results[kind].append(r)
            med = {k: (statistics.median(x[0] for x in rs), statistics.median(x[1] for x in rs),
                       len(rs)) for k, rs in results.items() if rs}
            rows.append((n, med))
            line = f"n={n:4d}"
            for k in kinds:
                if k in med:
                    m = med[k]
                    line += f"  {k} ready {m[0]:8.1f} ms total {m[1]:8.1f} ms ({m[2]} runs)"
            print(line, flush=True)
    finally:
        cluster.kill()
    print()
    for n, med in rows:
        e, c = med.get("etcd"), med.get("c10d")
        for i, name in ((0, "ready"), (1, "total")):
            if e and c:
                print(f"RESULT etcd_rdzv_{name}_n{n} {e[i]:.1f} ms peer={c[i]:.1f} "
                      f"ratio={e[i] / c[i]:.1f}")
            elif e:
                print(f"RESULT etcd_rdzv_{name}_n{n} {e[i]:.1f} ms")
    big = [med["etcd"][0] for n, med in rows if n == 256 and "etcd" in med]
    if big:
        print(f"target: 256 agents ready on etcd in < 1500 ms: "
              f"{'met' if big[0] < 1500 else 'not met'} ({big[0]:.0f} ms)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
