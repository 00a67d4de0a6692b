"""etcd_rendezvous_bench: how long N cpprun agents take to meet and start their workers on the
etcd backend (--rdzv-backend etcd-v2, a 3-member etcd cluster this benchmark starts on loopback)
against cpprun's c10d path (--rdzv-backend c10d, the first agent serves the store) and against
torchrun 2.x's own etcd backends on the same etcd cluster, side by side in one run; and, with
--lost-runs, how long the survivors take to declare a vanished agent lost (etcd and c10d).

    /usr/bin/python3 tests/bench/etcd_rendezvous_bench.py --cpprun build/cpprun \\
        --worker build/tests/bench/cpprun_bench_worker [--agents 1,8,64,256] [--runs 3] \\
        [--timeout 180] [--etcd /usr/bin/etcd] [--members 3] [--baseline OLD_CPPRUN] \\
        [--torch-agents 1,8,32] [--torch-backends etcd-v2,etcd] [--torch-timeout 120] \\
        [--torchrun /opt/cpprun/torch2/bin/torchrun] \\
        [--lost-runs 0] [--keep-alive-interval 1] [--keep-alive-max-attempt 3] [--lost-timeout 30]

Every agent is a separate process on this machine, as on N nodes, with one trivial worker
(cpprun_bench_worker started DIR: it writes its CLOCK_MONOTONIC start time and exits).
etcd:  `cpprun --nnodes N --nproc-per-node 1 --rdzv-backend etcd-v2 --rdzv-endpoint E1,E2,E3
        --rdzv-id bench-<n>-<rep> --no-python WORKER started DIR` (a fresh run id per run, so
        runs never share keys).
c10d:  `cpprun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P
        --rdzv-id bench --no-python WORKER started DIR`.
torchrun (the peer at --torch-agents N, for each of --torch-backends): the real CLI of the
        pinned torch 2.x (python-etcd from packaging/torch2-requirements.txt): `torchrun
        --nnodes N --nproc-per-node 1 --rdzv-backend etcd-v2|etcd --rdzv-endpoint E1
        --rdzv-id <fresh> --no-python WORKER started DIR` (torchrun takes one endpoint: the first
        member, the one cpprun's client starts with). etcd-v2 is torch's dynamic rendezvous over
        one etcd key; etcd is its older barrier protocol. A torchrun backend that fails or runs
        past --torch-timeout at some N is not run at larger N (reported on stderr).
The etcd members run with --heartbeat-interval 50 --election-timeout 500 (as the tests'
EtcdCluster), --enable-v2=true (torchrun's backends speak etcd's v2 API; cpprun only v3) and
fsync as usual: every etcd write is a raft commit to disk.

--baseline OLD_CPPRUN: a second cpprun build on the same etcd cluster at every N (kind
etcd-baseline, same command line), alternating with the others: a before/after comparison in
one invocation (RESULT etcd_rdzv_<figure>_n<N>_baseline <new ms> ms peer=<old ms>
ratio=<new/old>).
Requests: for each etcd run the benchmark reads every member's /metrics
(grpc_server_started_total, by gRPC method: the HTTP gateway calls etcd's own gRPC server, so
each /v3 request counts once, a watch or keep-alive stream once per stream) before and after,
and prints the difference per agent (median per method of the runs) and
RESULT etcd_rdzv_requests_per_agent_n<N>[_baseline] <requests> requests.
Figures per N, median of --runs (the variants alternate within each repetition):
  ready  from the first agent's spawn to the last worker's start (the slowest agent ready)
  total  from the first agent's spawn until every agent has exited
One line per figure: RESULT etcd_rdzv_<figure>_n<N> <etcd ms> ms peer=<c10d ms>
ratio=<etcd/c10d> (ratio > 1: etcd is slower); with torchrun:
RESULT etcd_rdzv_<figure>_n<N>_torchrun_etcd_v2 <cpprun etcd ms> ms peer=<torchrun ms>
ratio=<torchrun/cpprun> (and _torchrun_etcd). The issue's target (256 agents ready in under 1.5 s
on etcd) is printed as information.

Lost agent (--lost-runs R > 0, after the figures above): 3 cpprun agents, --nnodes=2:3, --rdzv-conf
keep_alive_interval=I,keep_alive_max_attempt=M, workers `/bin/sleep 300`, --event-log per agent.
Once every worker runs, one agent vanishes: its guardian, agent and worker are SIGSTOPped, then
SIGKILLed (as a node that loses power: no goodbye). The victim is group rank 0 ("node0") or the
highest rank that does not serve the c10d store ("nonzero"; on c10d losing the store host ends the
job by design; when node 0 serves it, its closed connection tells the survivors at once on one
host, which is printed but kept out of the medians). Figures, medians of R runs, etcd and c10d alternating: "declared" from the kill to
the first survivor log line declaring it gone ("... stopped responding: no heartbeat for ...";
millisecond stamps), "first_event" to the first event any survivor writes after the kill
(microseconds): RESULT etcd_lost_agent_<victim>_<figure> <etcd ms> ms peer=<c10d ms>
ratio=<etcd/c10d>, and the issue's target (declared within I x M + 1 s) as information.

Bounded: a run still going after --timeout is killed (SIGTERM, 5 s, SIGKILL, by PID) and counted
as failed; the etcd members are SIGKILLed by PID at the end (and carry no state: their data dirs
are temporary). This process is a child subreaper: whatever an agent leaves behind comes back to
it, is reported, killed and reaped. Exit status 1 when a run failed, 2 on a bad flag.
"""

import argparse
import ctypes
import datetime
import json
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
                 "--election-timeout=500", "--enable-v2=true"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL))
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

    def requests(self):
        """{grpc method: calls started} summed over the members (etcd's /metrics,
        grpc_server_started_total: the HTTP gateway calls its own gRPC server, so every
        /v3/... request counts once; a watch or keep-alive stream counts once per stream)."""
        counts = {}
        for e in self.endpoints:
            with urllib.request.urlopen(f"http://{e}/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if not line.startswith("grpc_server_started_total{"):
                        continue
                    labels, value = line.rsplit(" ", 1)
                    method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
                    counts[method] = counts.get(method, 0) + int(float(value))
        return counts

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


TORCH_KINDS = {"torchrun-etcd-v2": "etcd-v2", "torchrun-etcd": "etcd"}


def agent_command(kind, args, n, endpoint, run_id, run_dir):
    tail = ["--no-python", args.worker, "started", run_dir]
    if kind in TORCH_KINDS:
        # torchrun's etcd backends take one endpoint (host:port): the first member, the one
        # cpprun's client starts with too.
        return [args.torchrun, f"--nnodes={n}", "--nproc-per-node=1",
                f"--rdzv-backend={TORCH_KINDS[kind]}",
                f"--rdzv-endpoint={endpoint.split(',')[0]}", f"--rdzv-id={run_id}"] + tail
    binary = args.baseline if kind == "etcd-baseline" else args.cpprun
    common = [binary, f"--nnodes={n}", "--nproc-per-node=1"]
    if kind in ("etcd", "etcd-baseline"):
        return common + ["--rdzv-backend=etcd-v2", f"--rdzv-endpoint={endpoint}",
                         f"--rdzv-id={run_id}"] + tail
    return common + ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                     "--rdzv-id=bench"] + tail


def one_run(kind, args, n, cluster, rep):
    """Returns (ready_ms, total_ms, {etcd method: requests per agent}) or None when the run
    failed (the requests are counted for the etcd kind only)."""
    etcd_endpoints = cluster.endpoints
    run_dir = tempfile.mkdtemp(prefix=f"etcd-rdzv-bench-{kind}-")
    endpoint = (f"127.0.0.1:{free_port()}" if kind == "c10d" else ",".join(etcd_endpoints))
    run_id = f"bench-{kind}-{os.getpid()}-{n}-{rep}"
    env = dict(os.environ, OMP_NUM_THREADS="1", NCCL_SOCKET_IFNAME="lo")
    procs = []
    ok = True
    counted = kind in ("etcd", "etcd-baseline")
    before = cluster.requests() if counted else {}
    try:
        t0 = time.monotonic_ns()
        for rank in range(n):
            procs.append(spawn(agent_command(kind, args, n, endpoint, run_id, run_dir), env,
                               os.path.join(run_dir, f"agent-{rank}.log")))
        codes = wait_all(procs, args.torch_timeout if kind in TORCH_KINDS else args.timeout)
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
        after = cluster.requests() if counted else {}
        per_agent = {m: (after[m] - before.get(m, 0)) / n for m in after
                     if after[m] > before.get(m, 0)}
        return ((max(starts) - t0) / 1e6, (t_end - t0) / 1e6, per_agent)
    finally:
        for _, pfd in procs:
            os.close(pfd)
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)


def descendants(pid):
    """pid and every process below it (the agent's guardian, agent and workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += map(int, open(f"/proc/{p}/task/{task}/children").read().split())
        except OSError:
            pass
    return out


def read_events(path):
    events = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    events.append(json.loads(line))
    except OSError:
        pass
    return events


def lost_agent_run(kind, victim, args, etcd_endpoints, rep):
    """3 agents, --nnodes=2:3, workers sleeping; once every worker runs, the agent that is group
    rank 0 (victim "node0") or the highest rank that does not serve the c10d store ("nonzero")
    vanishes: its guardian, agent and worker are SIGSTOPped, then SIGKILLed, so it says nothing.
    Returns (event_ms, first event, first declaring log line, victim was the c10d store host,
    declared_ms) or None: event_ms is from the kill to the earliest event any survivor logs after
    it (--event-log, microseconds), declared_ms to the earliest survivor log line that declares
    the agent gone (millisecond stamps; None when no line says so)."""
    run_dir = tempfile.mkdtemp(prefix=f"etcd-lost-bench-{kind}-")
    endpoint = (f"127.0.0.1:{free_port()}" if kind == "c10d" else ",".join(etcd_endpoints))
    backend = "c10d" if kind == "c10d" else "etcd-v2"
    conf = (f"keep_alive_interval={args.keep_alive_interval:g},"
            f"keep_alive_max_attempt={args.keep_alive_max_attempt}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    try:
        for i in range(3):
            argv = [args.cpprun, "--nnodes=2:3", "--nproc-per-node=1", f"--rdzv-backend={backend}",
                    f"--rdzv-endpoint={endpoint}", f"--rdzv-id=lost-{os.getpid()}-{victim}-{rep}",
                    "--rdzv-conf", conf, f"--event-log={run_dir}/events.{i}", "--no-python",
                    "/bin/sleep", "300"]
            procs.append(spawn(argv, env, os.path.join(run_dir, f"agent-{i}.log")))
        ranks = {}
        deadline = time.monotonic() + 60
        while len(ranks) < 3 and time.monotonic() < deadline:
            for i in range(3):
                ev = read_events(f"{run_dir}/events.{i}")
                done = [e for e in ev if e["event"] == "rendezvous_completed"]
                if done and any(e["event"] == "worker_started" for e in ev):
                    ranks[i] = done[-1]["group_rank"]
            time.sleep(0.02)
        if len(ranks) < 3:
            sys.stderr.write(f"lost-agent {kind}: workers not all started within 60 s; logs in "
                             f"{run_dir}\n")
            return None
        store_host = None
        for i in range(3):
            if "serves the job's store" in open(f"{run_dir}/agent-{i}.log").read():
                store_host = i
        if victim == "node0":
            v = next(i for i in range(3) if ranks[i] == 0)
        else:
            v = max((i for i in range(3) if ranks[i] != 0 and i != store_host),
                    key=lambda i: ranks[i])
        tree = descendants(procs[v][0])
        t_kill = time.time()
        for p in tree:
            os.kill(p, signal.SIGSTOP)
        for p in tree:
            os.kill(p, signal.SIGKILL)
        survivors = [i for i in range(3) if i != v]
        first = None
        deadline = time.monotonic() + args.lost_timeout
        while first is None and time.monotonic() < deadline:
            for i in survivors:
                for e in read_events(f"{run_dir}/events.{i}"):
                    if e["time_us"] / 1e6 > t_kill and (first is None or
                                                         e["time_us"] < first["time_us"]):
                        first = e
                        break
            time.sleep(0.01)
        # The survivors' own words: the first log line that declares an agent (or the store) gone,
        # "cpprun <UTC time> ERROR the agent of node 2 (host) stopped responding: ...".
        said = []
        for i in survivors:
            for line in open(f"{run_dir}/agent-{i}.log", errors="replace"):
                if "stopped responding" in line or " lost" in line:
                    stamp = line.split()[1]
                    t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                        tzinfo=datetime.timezone.utc).timestamp()
                    said.append((t, line.strip()))
                    break
        said_ms, lost_line = ((min(said)[0] - t_kill) * 1e3, min(said)[1]) if said else (None, "")
        for i in survivors:
            os.kill(procs[i][0], signal.SIGTERM)
        rest = wait_all([procs[i] for i in survivors], 20)
        for i in survivors:
            if procs[i][0] not in rest:
                os.kill(procs[i][0], signal.SIGKILL)
        os.waitpid(procs[v][0], 0)
        reap_leftovers()
        if first is None:
            sys.stderr.write(f"lost-agent {kind} {victim}: no survivor logged anything within "
                             f"{args.lost_timeout} s of the kill; logs in {run_dir}\n")
            return None
        shutil.rmtree(run_dir, ignore_errors=True)
        return ((first["time_us"] / 1e6 - t_kill) * 1e3, first["event"], lost_line,
                v == store_host, said_ms)
    finally:
        for _, pfd in procs:
            os.close(pfd)


def lost_agent_bench(args, cluster):
    bound = args.keep_alive_interval * args.keep_alive_max_attempt
    failed = False
    print(f"lost agent: 3 agents --nnodes=2:3, keep_alive_interval={args.keep_alive_interval:g} "
          f"keep_alive_max_attempt={args.keep_alive_max_attempt} (bound {bound:g} s, target "
          f"bound + 1 s), {args.lost_runs} runs each", flush=True)
    rows = []
    store_host_runs = []
    for victim in ("nonzero", "node0"):
        results = {"etcd": [], "c10d": []}
        for rep in range(args.lost_runs):
            order = ["etcd", "c10d"] if rep % 2 == 0 else ["c10d", "etcd"]
            for kind in order:
                r = lost_agent_run(kind, victim, args, cluster.endpoints, rep)
                if r is None or r[4] is None:
                    failed = True
                    continue
                if r[3]:
                    # The c10d store host's sockets close with it on one host (FIN): the
                    # survivors see the store go at once, which a powered-off node would not
                    # show. Reported on its own, kept out of the medians.
                    store_host_runs.append(r[4])
                else:
                    results[kind].append(r)
                print(f"  {kind:4} {victim:7} run {rep}: declared {r[4]:6.0f} ms, first event "
                      f"{r[0]:6.0f} ms ({r[1]}){' [victim served the store]' if r[3] else ''}: "
                      f"{r[2][31:150]}", flush=True)
        rows.append((victim, {k: (statistics.median(x[4] for x in v),
                                  statistics.median(x[0] for x in v), len(v))
                              for k, v in results.items() if v}))
    print()
    for victim, med in rows:
        e, c = med.get("etcd"), med.get("c10d")
        for i, fig in ((0, "declared"), (1, "first_event")):
            name = f"etcd_lost_agent_{victim}_{fig}"
            if e and c:
                print(f"RESULT {name} {e[i]:.0f} ms peer={c[i]:.0f} ratio={e[i] / c[i]:.2f}")
            elif e:
                print(f"RESULT {name} {e[i]:.0f} ms")
            elif c:
                print(f"RESULT {name}_c10d_only {c[i]:.0f} ms")
        for k, m in med.items():
            print(f"target {k} {victim}: declared lost within {bound:g} s + 1 s of the kill: "
                  f"{'met' if m[0] <= (bound + 1) * 1e3 else 'not met'} ({m[0]:.0f} ms, "
                  f"{m[2]} runs)")
    if store_host_runs:
        print(f"c10d runs whose victim served the store (the closed connection, not a "
              f"heartbeat bound, told the others; not in the medians): "
              f"{', '.join(f'{x:.0f} ms' for x in store_host_runs)}")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpprun", required=True)
    parser.add_argument("--baseline", default="",
                        help="a second cpprun build run on etcd beside --cpprun at every N, "
                        "alternating (RESULT ..._baseline lines, ratio new/old)")
    parser.add_argument("--worker", required=True)
    parser.add_argument("--etcd", default="/usr/bin/etcd")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--agents", default="1,8,64,256")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--torchrun", default=os.path.join(
        os.environ.get("CPPRUN_TORCH2_VENV", "/opt/cpprun/torch2"), "bin", "torchrun"))
    parser.add_argument("--torch-agents", default="1,8,32")
    parser.add_argument("--torch-backends", default="etcd-v2,etcd")
    parser.add_argument("--torch-timeout", type=float, default=120)
    parser.add_argument("--lost-runs", type=int, default=0)
    parser.add_argument("--lost-timeout", type=float, default=30)
    parser.add_argument("--keep-alive-interval", type=float, default=1)
    parser.add_argument("--keep-alive-max-attempt", type=int, default=3)
    args = parser.parse_args()
    try:
        agents = set(parse_list(args.agents))
        torch_agents = set(parse_list(args.torch_agents))
    except ValueError:
        parser.error("--agents and --torch-agents take comma-separated integers")
    torch_kinds = [f"torchrun-{b}" for b in args.torch_backends.split(",") if b]
    for k in torch_kinds:
        if k not in TORCH_KINDS:
            parser.error(f"--torch-backends: unknown backend '{k[9:]}' (etcd-v2, etcd)")
    if torch_agents and torch_kinds and not os.access(args.torchrun, os.X_OK):
        sys.stderr.write(f"etcd_rendezvous_bench: no torchrun at {args.torchrun} (install it with "
                         "packaging/setup.sh, pass --torchrun, or --torch-agents '')\n")
        return 1
    if not os.access(args.etcd, os.X_OK):
        sys.stderr.write(f"etcd_rendezvous_bench: no etcd at {args.etcd} (Debian's etcd-server; "
                         "pass --etcd)\n")
        return 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    cluster = EtcdCluster(args.etcd, args.members, 30)
    failed = False
    rows = []
    given_up = set()  # torch kinds that failed or ran out of time at a smaller N
    try:
        for n in sorted(agents | torch_agents):
            kinds = (["etcd"] + (["etcd-baseline"] if args.baseline else []) + ["c10d"]
                     if n in agents else []) + \
                [k for k in torch_kinds if n in torch_agents and k not in given_up]
            results = {k: [] for k in kinds}
            for rep in range(args.runs):
                order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
                for kind in order:
                    if kind in given_up:
                        continue
                    r = one_run(kind, args, n, cluster, rep)
                    if r is None:
                        failed = True
                        if kind in TORCH_KINDS:
                            given_up.add(kind)
                            sys.stderr.write(f"{kind}: not run above {n} agents\n")
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
                    runs = ", ".join(f"{x[0]:.0f}" for x in results[k])
                    line += f" [ready per run: {runs}]"
            print(line, flush=True)
            for k in ("etcd", "etcd-baseline"):
                if not results.get(k):
                    continue
                # etcd requests per agent over the whole run (one job: one rendezvous round),
                # median per method over the runs
                methods = sorted({m for x in results[k] for m in x[2]})
                per = {m: statistics.median(x[2].get(m, 0) for x in results[k]) for m in methods}
                print(f"       {k} requests per agent (median of {len(results[k])} runs): "
                      + ", ".join(f"{m} {v:.2f}" for m, v in per.items())
                      + f"; total {sum(per.values()):.2f}", flush=True)
                suffix = "_baseline" if k == "etcd-baseline" else ""
                print(f"RESULT etcd_rdzv_requests_per_agent_n{n}{suffix} "
                      f"{sum(per.values()):.2f} requests", flush=True)
        print()
        for n, med in rows:
            e, c = med.get("etcd"), med.get("c10d")
            for i, name in ((0, "ready"), (1, "total")):
                if e and c:
                    print(f"RESULT etcd_rdzv_{name}_n{n} {e[i]:.1f} ms peer={c[i]:.1f} "
                          f"ratio={e[i] / c[i]:.1f}")
                elif e:
                    print(f"RESULT etcd_rdzv_{name}_n{n} {e[i]:.1f} ms")
                old = med.get("etcd-baseline")
                if e and old:
                    print(f"RESULT etcd_rdzv_{name}_n{n}_baseline {e[i]:.1f} ms peer={old[i]:.1f} "
                          f"ratio={e[i] / old[i]:.2f}")
                # torchrun's etcd backends on the same cluster: the peer; ratio torch/cpprun
                for k in torch_kinds:
                    t = med.get(k)
                    suffix = "_torchrun_" + TORCH_KINDS[k].replace("-", "_")
                    if t and e:
                        print(f"RESULT etcd_rdzv_{name}_n{n}{suffix} {e[i]:.1f} ms "
                              f"peer={t[i]:.1f} ratio={t[i] / e[i]:.1f}")
                    elif t:
                        print(f"RESULT etcd_rdzv_{name}_n{n}{suffix}_torch_only {t[i]:.1f} ms")
        big = [med["etcd"][0] for n, med in rows if n == 256 and "etcd" in med]
        if big:
            print(f"target: 256 agents ready on etcd in < 1500 ms: "
                  f"{'met' if big[0] < 1500 else 'not met'} ({big[0]:.0f} ms)")
        if args.lost_runs > 0:
            print()
            failed = lost_agent_bench(args, cluster) or failed
    finally:
        cluster.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
