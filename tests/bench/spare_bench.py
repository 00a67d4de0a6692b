"""spare_bench: how long a hot spare takes to replace a lost node, with real cpprun agents on
loopback, on both rendezvous backends (c10d: the first agent serves the store; etcd: a 1-member
etcd this benchmark starts), alternating within each repetition.

    /usr/bin/python3 tests/bench/spare_bench.py --cpprun build/cpprun \\
        --worker build/tests/cpprun_test_worker [--runs 5] [--nodes 2] [--spares 1] \\
        [--keep-alive-interval 1] [--keep-alive-max-attempt 3] [--etcd /usr/bin/etcd] \\
        [--timeout 60] [--loss kill|drain] [--peer-reset 0.5] [--backend both|c10d|etcd]

A job of exactly --nodes nodes (`--nnodes=N:N`, one worker each) and --spares more agents, each
a separate process (`cpprun --nnodes=N:N --nproc-per-node=1 --rdzv-backend c10d|etcd
--rdzv-conf keep_alive_interval=I,keep_alive_max_attempt=M --max-restarts=0 --event-log ...
--no-python WORKER stall-if-restart 0 exit 0`: attempt 0's workers run until stopped;
the next attempt's exit 0 at once). Once attempt 0's workers all run and the spares say they
wait, the active node with the highest group rank that does not serve the c10d store (on etcd:
not the round's node 0, the decider) is lost as a node
that loses power: its guardian, agent and worker are SIGSTOPped, then SIGKILLed (no goodbye).

--peer-reset S: attempt 0's workers do not stall but wait for a file the benchmark writes S
seconds after the kill, then exit 1: what a real trainer's collective does when its peer is gone
(gloo's connection reset came ~0.5 s after the kill, measured). The survivors then claim the
attempt's stop at once, and the decider may give up the dead node before the liveness bound.

With --loss drain the same node is drained instead (POST /leave on its --metrics-port; it must
answer 202 and the agent exit 0), and the figures are named drain_spare_*.

Figures (epoch microseconds of the agents' --event-log against the kill's time.time()), medians
of --runs:
  decided  kill -> the first survivor's `restart` event (membership change decided)
  running  kill -> the last `worker_started` event of the next attempt (every worker of the
           re-formed group, the spare's included, spawned)
One line per figure: RESULT spare_<figure>_<backend> <ms> ms (no peer in this run: NVIDIA's
ft_launcher is measured by tests/bench on the issue's comparison), and the bound the liveness
settings imply (I x M) as information. A run is failed when the world size of the next attempt is
not N, a restart of the budget was used, or it does not finish within --timeout.

This process is a child subreaper: whatever an agent leaves behind comes back to it and is
killed and reaped. Exit status 1 when a run failed, 2 on a bad flag.
"""

import argparse
import ctypes
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rendezvous_bench import PR_SET_CHILD_SUBREAPER, free_port, spawn, wait_all  # noqa: E402
from etcd_rendezvous_bench import (EtcdCluster, descendants, read_events,  # noqa: E402
                                   reap_leftovers)


def one_run(backend, args, etcd_endpoints, rep):
    """Returns (decided_ms, running_ms) or None (the reason on stderr)."""
    run_dir = tempfile.mkdtemp(prefix=f"spare-bench-{backend}-")
    agents = args.nodes + args.spares
    endpoint = f"127.0.0.1:{free_port()}" if backend == "c10d" else ",".join(etcd_endpoints)
    conf = (f"keep_alive_interval={args.keep_alive_interval:g},"
            f"keep_alive_max_attempt={args.keep_alive_max_attempt},last_call_timeout=30")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    peer_gone = os.path.join(run_dir, "peer-gone")
    if args.peer_reset > 0:
        worker_args = ["exit-if-restart", "1", "0", "exit-if-restart", "2", "0",
                       "wait-file", peer_gone, "600", "exit", "1"]
    else:
        worker_args = ["stall-if-restart", "0", "exit", "0"]
    procs = []
    ok = False
    try:
        for i in range(agents):
            argv = [args.cpprun, f"--nnodes={args.nodes}:{args.nodes}", "--nproc-per-node=1",
                    f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}",
                    f"--rdzv-id=spare-{os.getpid()}-{rep}", "--rdzv-conf", conf,
                    "--max-restarts=0", f"--event-log={run_dir}/events.{i}",
                    "--metrics-port=0", "--no-python",
                    args.worker] + worker_args
            procs.append(spawn(argv, env, os.path.join(run_dir, f"agent-{i}.log")))
        ranks, spares = {}, set()
        deadline = time.monotonic() + args.timeout
        while len(ranks) + len(spares) < agents and time.monotonic() < deadline:
            ranks, spares = {}, set()
            for i in range(agents):
                ev = read_events(f"{run_dir}/events.{i}")
                done = [e for e in ev if e["event"] == "rendezvous_completed"]
                if done and any(e["event"] == "worker_started" for e in ev):
                    ranks[i] = done[-1]["group_rank"]
                elif "waits as a spare" in open(f"{run_dir}/agent-{i}.log").read():
                    spares.add(i)
            time.sleep(0.02)
        if len(ranks) != args.nodes or len(spares) != args.spares:
            sys.stderr.write(f"{backend}: not {args.nodes} running and {args.spares} spare(s) "
                             f"within {args.timeout} s; logs in {run_dir}\n")
            return None
        store_host = next((i for i in range(agents) if "serves the job's store" in
                           open(f"{run_dir}/agent-{i}.log").read()), None)
        # Not the c10d store host (its loss ends the job by design); of the others the highest
        # rank, so on etcd not the round's node 0 (the decider) either.
        v = max((i for i in ranks if i != store_host), key=lambda i: ranks[i])
        if args.loss == "drain":
            log = open(f"{run_dir}/agent-{v}.log").read()
            port = int(log.split("metrics on http://127.0.0.1:")[1].split("/")[0])
            request = urllib.request.Request(f"http://127.0.0.1:{port}/leave", method="POST")
            t_kill = time.time()
            with urllib.request.urlopen(request, timeout=20) as answer:
                if answer.status != 202:
                    sys.stderr.write(f"{backend}: POST /leave answered {answer.status}\n")
                    return None
        else:
            tree = descendants(procs[v][0])
            t_kill = time.time()
            for p in tree:
                os.kill(p, signal.SIGSTOP)
            for p in tree:
                os.kill(p, signal.SIGKILL)
            if args.peer_reset > 0:
                time.sleep(args.peer_reset)  # the stimulus: the survivors' collective fails
                open(peer_gone, "w").close()
        others = [i for i in range(agents) if i != v]
        codes = wait_all([procs[i] for i in others], args.timeout)
        if args.loss == "drain":
            codes.update(wait_all([procs[v]], args.timeout))
            others.append(v)  # the drained agent must exit 0 too
        else:
            os.waitpid(procs[v][0], 0)
        reap_leftovers()
        if len(codes) != len(others) or any(c != 0 for c in codes.values()):
            sys.stderr.write(f"{backend}: exit codes {codes} (want 0 from all {len(others)}); "
                             f"logs in {run_dir}\n")
            return None
        decided, started, world = None, [], set()
        for i in others:
            for e in read_events(f"{run_dir}/events.{i}"):
                if e["time_us"] / 1e6 < t_kill:
                    continue
                if e["event"] == "restart":
                    if e.get("restarts_used", 0) != 0:
                        sys.stderr.write(f"{backend}: a restart of the budget was used\n")
                        return None
                    t = e["time_us"] / 1e6
                    decided = t if decided is None else min(decided, t)
                if e["event"] == "worker_started" and e["attempt"] >= 1:
                    started.append(e["time_us"] / 1e6)
                if e["event"] == "rendezvous_completed":
                    world.add(e["world_size"])
        if decided is None or len(started) != args.nodes or world != {args.nodes}:
            sys.stderr.write(f"{backend}: next attempt not as expected ({len(started)} workers, "
                             f"world sizes {world}); logs in {run_dir}\n")
            return None
        ok = True
        return ((decided - t_kill) * 1e3, (max(started) - t_kill) * 1e3)
    finally:
        for pid, pfd in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(pfd)
        reap_leftovers()
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpprun", required=True)
    p.add_argument("--worker", required=True, help="cpprun_test_worker")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--spares", type=int, default=1)
    p.add_argument("--keep-alive-interval", type=float, default=1.0)
    p.add_argument("--keep-alive-max-attempt", type=int, default=3)
    p.add_argument("--etcd", default="/usr/bin/etcd")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--loss", choices=("kill", "drain"), default="kill",
                   help="kill: the node loses power; drain: POST /leave on its agent")
    p.add_argument("--peer-reset", type=float, default=0,
                   help="attempt 0's survivors fail this many seconds after the kill (0: they "
                        "stall until stopped)")
    p.add_argument("--backend", choices=("both", "c10d", "etcd"), default="both")
    args = p.parse_args()
    if args.nodes < 2 or args.spares < 1 or args.runs < 1:
        p.error("--nodes >= 2, --spares >= 1 and --runs >= 1")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    cluster = EtcdCluster(args.etcd, 1, 30)
    failed = 0
    results = {"c10d": [], "etcd": []}
    try:
        for rep in range(args.runs):
            for backend in ("c10d", "etcd") if args.backend == "both" else (args.backend,):
                r = one_run(backend, args, cluster.endpoints, rep)
                if r is None:
                    failed += 1
                    continue
                results[backend].append(r)
                print(f"run {rep} {backend}: decided {r[0]:.0f} ms, running {r[1]:.0f} ms",
                      flush=True)
    finally:
        cluster.kill()
    bound = args.keep_alive_interval * args.keep_alive_max_attempt
    print(f"loss: {args.loss}; {args.nodes} nodes + {args.spares} spare(s), keep_alive_interval="
          f"{args.keep_alive_interval:g} s x {args.keep_alive_max_attempt} (liveness bound "
          f"{bound:g} s; etcd: lease TTL {max(1, round(bound))} s), medians of "
          f"{args.runs} run(s):")
    print(f"{'backend':8} {'decided ms':>12} {'running ms':>12} {'runs':>5}")
    for backend, rs in results.items():
        if not rs:
            continue
        d = statistics.median(r[0] for r in rs)
        g = statistics.median(r[1] for r in rs)
        print(f"{backend:8} {d:12.0f} {g:12.0f} {len(rs):5d}   (running: min "
              f"{min(r[1] for r in rs):.0f}, max {max(r[1] for r in rs):.0f})")
    for backend, rs in results.items():
        if rs:
            name = "spare" if args.loss == "kill" else "drain_spare"
            print(f"RESULT {name}_decided_{backend} {statistics.median(r[0] for r in rs):.0f} ms")
            print(f"RESULT {name}_running_{backend} {statistics.median(r[1] for r in rs):.0f} ms")
    if failed:
        print(f"{failed} run(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
