"""rendezvous_bench: how long N agents take to meet and start their workers, cpprun against torch
2.x's torchrun and torch 1.13's elastic launcher, both with the c10d rendezvous, side by side in
one run.

    /usr/bin/python3 tests/bench/rendezvous_bench.py --cpprun build/cpprun \\
        --worker build/tests/bench/cpprun_bench_worker [--agents 1,2,4,...,256] \\
        [--torch2-agents 1,2,4,8,16] [--torch-agents 1,2,4,8,16] [--runs 3] [--timeout 180] \\
        [--torchrun /opt/cpprun/torch2/bin/torchrun] [--cpprun-backend static|c10d] \\
        [--baseline OLD_CPPRUN]

Every agent is a separate process on this machine, as on N nodes, with one trivial worker
(cpprun_bench_worker started DIR: it writes its CLOCK_MONOTONIC start time and exits).
cpprun: `cpprun --nnodes N --node-rank R --nproc-per-node 1 --master-addr 127.0.0.1
--master-port P --no-python WORKER started DIR` (static rendezvous: node 0 serves the store).
torchrun2: the real torchrun CLI of torch 2.x (--torchrun; default
${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}/bin/torchrun) with its default settings:
`torchrun --nnodes=N --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:P
--rdzv-id=bench --no-python WORKER started DIR` (the first agent to bind the endpoint hosts the
store). This is the anchor: the unsuffixed RESULT lines compare with it.
--cpprun-backend c10d: cpprun agents meet through `--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:P
--rdzv-id=bench` instead (the first agent to bind the endpoint serves the store).
--baseline OLD_CPPRUN: a second cpprun binary (an older build), run like cpprun at every
--agents N and alternating with it; RESULT rdzv_<figure>_n<N>_baseline <cpprun ms> ms
peer=<baseline ms> ratio=<cpprun/baseline> (> 1: this build is slower).
torch (1.13): tests/bench/torch_elastic_launch.py --nnodes N --rdzv-backend c10d (what 1.13's
torchrun --nnodes N --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:P calls) with monitor_interval
0.1 s (2.x torchrun's default; favours 1.13). RESULT lines with the suffix _t113.

Figures per N, median of --runs (launchers alternate within each repetition):
  ready  from the first agent's spawn to the last worker's start (all ranks started)
  total  from the first agent's spawn until every agent has exited
  spawn  the benchmark's own time to create the N agent processes (posix_spawn; part of
         "ready", the same for both)
One line per figure and peer: RESULT rdzv_<figure>_n<N>[_t113] <cpprun ms> ms peer=<torch ms>
ratio=<torch/cpprun> (peer and ratio only where that torch ran that N). Torch's agents need
~1.3 s of CPU each to import torch and ~230 MB (1.13) or ~530 MB (2.x, CUDA wheel), so
--torch2-agents and --torch-agents stop lower than --agents.

Bounded: a run still going after --timeout is killed (SIGTERM, 5 s, SIGKILL, by PID) and counted
as failed. This process is a child subreaper: whatever an agent leaves behind comes back to it,
is reported, killed and reaped. Exit status 1 when a run failed, 2 on a bad flag.
"""

import argparse
import ctypes
import os
import selectors
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time

PR_SET_CHILD_SUBREAPER = 36
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def zombie(pid) -> bool:
    """Whether pid has exited and waits to be reaped (state Z in /proc/PID/stat)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].startswith("Z")


def reap_leftovers(keep=frozenset()) -> int:
    """Kills and reaps every process that was re-parented to us, except the pids in `keep` (our
    own long-lived children, such as etcd members); returns how many there were."""
    count = 0
    try:
        children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
    except OSError:
        children = []
    for pid in map(int, children):
        if pid in keep:
            continue
        if zombie(pid):
            # An exited process re-parented to us on purpose: cpprun's job sentinel is forked
            # twice (nobody's child in cpprun's tree) and ends as the job does; only reaped.
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            continue
        count += 1
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return count


def agent_command(kind, args, n, rank, port, run_dir):
    if kind in ("cpprun", "baseline"):
        binary = args.cpprun if kind == "cpprun" else args.baseline
        if args.cpprun_backend == "c10d":
            return [binary, f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench", "--no-python",
                    args.worker, "started", run_dir]
        return [binary, f"--nnodes={n}", f"--node-rank={rank}", "--nproc-per-node=1",
                "--master-addr=127.0.0.1", f"--master-port={port}", "--no-python", args.worker,
                "started", run_dir]
    if kind == "torchrun2":
        return [args.torchrun, f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench", "--no-python",
                args.worker, "started", run_dir]
    return [args.python, os.path.join(HERE, "torch_elastic_launch.py"), "--nproc", "1",
            "--port", str(port), "--nnodes", str(n), "--rdzv-backend", "c10d",
            "--monitor-interval", "0.1", "--run-id", "bench", args.worker, "started", run_dir]


def spawn(argv, env, log_path):
    """posix_spawn (vfork underneath): creating the agents costs the benchmark little and the
    same for both launchers. Returns (pid, pidfd)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2),
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)])
    finally:
        os.close(fd)
    return pid, os.pidfd_open(pid)


def wait_all(procs, timeout):
    """Waits (pidfds, no polling) until every (pid, pidfd) has exited or `timeout` passed.
    Returns {pid: exit code} of those that exited."""
    codes = {}
    sel = selectors.DefaultSelector()
    for pid, pfd in procs:
        sel.register(pfd, selectors.EVENT_READ, pid)
    deadline = time.monotonic() + timeout
    while len(codes) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(timeout=left):
            pid = key.data
            _, status = os.waitpid(pid, 0)
            codes[pid] = os.waitstatus_to_exitcode(status)
            sel.unregister(key.fd)
    sel.close()
    return codes


def one_run(kind, args, n):
    """Returns (ready_ms, total_ms, spawn_ms) or None when the run failed."""
    run_dir = tempfile.mkdtemp(prefix=f"rdzv-bench-{kind}-")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", NCCL_SOCKET_IFNAME="lo")
    procs = []
    ok = True
    try:
        t0 = time.monotonic_ns()
        for rank in range(n):
            procs.append(spawn(agent_command(kind, args, n, rank, port, run_dir), env,
                               os.path.join(run_dir, f"agent-{rank}.log")))
        t_spawned = time.monotonic_ns()
        codes = wait_all(procs, args.timeout)
        t_end = time.monotonic_ns()
        if len(codes) < n or any(c != 0 for c in codes.values()):
            ok = False
            stop_failed_run(kind, n, procs, codes, run_dir, shown=3)
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
        return ((max(starts) - t0) / 1e6, (t_end - t0) / 1e6, (t_spawned - t0) / 1e6)
    finally:
        for _, pfd in procs:
            os.close(pfd)
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)


def stop_failed_run(kind, n, procs, codes, run_dir, shown):
    """A run that timed out or failed: SIGTERM the agents still running, SIGKILL them after 5 s
    (by PID), then print the tail of the first `shown` agents' logs."""
    for pid, _ in procs:
        if pid not in codes:
            os.kill(pid, signal.SIGTERM)
    rest = wait_all([p for p in procs if p[0] not in codes], 5)
    for pid, _ in procs:
        if pid not in codes and pid not in rest:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    sys.stderr.write(f"{kind} n={n}: run failed ({len(codes)} of {n} exited, codes "
                     f"{sorted(set(codes.values()))}); logs in {run_dir}\n")
    for rank in range(min(n, shown)):
        with open(os.path.join(run_dir, f"agent-{rank}.log"), "rb") as f:
            sys.stderr.write(f.read()[-2000:].decode(errors="replace"))


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpprun", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--torchrun", default=os.path.join(
        os.environ.get("CPPRUN_TORCH2_VENV", "/opt/cpprun/torch2"), "bin", "torchrun"))
    parser.add_argument("--agents", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--torch-agents", default="1,2,4,8,16")
    parser.add_argument("--torch2-agents", default="1,2,4,8,16")
    parser.add_argument("--baseline", default="",
                        help="a second cpprun binary (an older build) run at every --agents N")
    parser.add_argument("--cpprun-backend", choices=("static", "c10d"), default="static")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args()
    try:
        agents = set(parse_list(args.agents))
        torch_agents = set(parse_list(args.torch_agents))
        torch2_agents = set(parse_list(args.torch2_agents))
    except ValueError:
        parser.error("--agents, --torch-agents and --torch2-agents take comma-separated integers")
    if torch2_agents and not os.access(args.torchrun, os.X_OK):
        sys.stderr.write(f"rendezvous_bench: the torch 2.x peer needs torchrun at {args.torchrun} "
                         "(install it with packaging/setup.sh, pass --torchrun, or "
                         "--torch2-agents '')\n")
        return 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    failed = False
    rows = []
    for n in sorted(agents | torch_agents | torch2_agents):
        kinds = [k for k, ns in (("cpprun", agents), ("baseline", agents if args.baseline else ()),
                                 ("torchrun2", torch2_agents), ("torch", torch_agents)) if n in ns]
        results = {k: [] for k in kinds}
        for rep in range(args.runs):
            order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
            for kind in order:
                r = one_run(kind, args, n)
                if r is None:
                    failed = True
                else:
                    results[kind].append(r)
        med = {}
        for k, rs in results.items():
            if rs:
                med[k] = tuple(statistics.median(x[i] for x in rs) for i in range(3)) + (len(rs),)
        rows.append((n, med))
        c = med.get("cpprun")
        line = f"n={n:4d}"
        if c:
            line += f"  cpprun ready {c[0]:8.1f} ms total {c[1]:8.1f} ms spawn {c[2]:7.1f} ms ({c[3]} runs)"
        for kind, label in (("baseline", "baseline"), ("torchrun2", "torchrun2"),
                            ("torch", "t1.13")):
            t = med.get(kind)
            if t:
                line += f"  {label} ready {t[0]:8.1f} ms total {t[1]:8.1f} ms ({t[3]} runs)"
        print(line, flush=True)

    print()
    for n, med in rows:
        c = med.get("cpprun")
        b = med.get("baseline")
        for i, name in ((0, "ready"), (1, "total")):
            if c and b:  # this build against the older one: ratio new/old (> 1: slower now)
                print(f"RESULT rdzv_{name}_n{n}_baseline {c[i]:.1f} ms peer={b[i]:.1f} "
                      f"ratio={c[i] / b[i]:.2f}")
        for kind, suffix in (("torchrun2", ""), ("torch", "_t113")):
            t = med.get(kind)
            for i, name in ((0, "ready"), (1, "total")):
                if c and t:
                    print(f"RESULT rdzv_{name}_n{n}{suffix} {c[i]:.1f} ms peer={t[i]:.1f} "
                          f"ratio={t[i] / c[i]:.1f}")
                elif t:
                    print(f"RESULT rdzv_{name}_n{n}{suffix}_torch_only {t[i]:.1f} ms")
        if c and not any(k in med for k in ("baseline", "torchrun2", "torch")):
            for i, name in ((0, "ready"), (1, "total")):
                print(f"RESULT rdzv_{name}_n{n} {c[i]:.1f} ms")
    big = [med["cpprun"][0] for n, med in rows if n == 256 and "cpprun" in med]
    if big:
        print(f"target: 256 agents ready in < 1000 ms: {'met' if big[0] < 1000 else 'not met'} "
              f"({big[0]:.0f} ms)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
