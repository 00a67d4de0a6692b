#!/usr/bin/env python3
"""Resilience: cpprun vs NVIDIA's ft_launcher vs torchrun 2.x, the same 2-rank gloo worker, one run.

    tests/bench/install_ft_launcher.sh          # once: ft_launcher outside the clone
    tests/bench/resilience_bench.py             # --runs 3 --stall-timeout 5

The worker is tests/bench/resilience_worker.py (torch 2.x from $CPPRUN_TORCH2_VENV, gloo on the
CPU); every launcher runs it as a .py script under that venv's python. Scenarios, each run --runs
times per launcher, the launchers' order rotating from one repetition to the next:

  fail            2 workers on one node, --max-restarts 1; at step 10 rank 1 exits 1.
                  fault_spawned: rank 1's `fail` stamp (just before exit) -> the first worker of
                  the next attempt at the top of its script; fault_ready: -> the last worker of
                  the next attempt with its gloo process group up (init + one all_reduce).
  hang            the same, but rank 1 stops taking part (blocks on an Event), so rank 0 blocks
                  in a real gloo all_reduce; the trainer reports progress every step (cpprun:
                  examples/python/cpprun_progress.py, ft_launcher: RankMonitorClient
                  heartbeats). hang_detected: rank 1's `hang` stamp -> the launcher's first
                  output line saying so (time of arrival at the benchmark); hang_spawned: -> the
                  first worker of the next attempt.
  hang-unchanged  the same hang with no progress calls at all (an unchanged trainer), no
                  earlier than --stall-timeout + --hang-after-extra s after the worker's start:
                  unchanged_detected, or "not detected" when nothing is seen within
                  --stall-timeout + --detect-grace seconds (the job is then killed), or "false
                  stall" when the launcher reports a stall before the trainer hung (a failure).
  loss            3 agents on loopback, c10d rendezvous, 1 worker each, 2 needed
                  (--loss-nnodes-cpprun/-ft/-torchrun: 2:2, 2:3, 2:2; the third is the spare);
                  once both workers are up and have run a second, the benchmark SIGKILLs
                  (SIGSTOP first, so nothing reacts half-killed) one active agent that does
                  not host the store, with its whole tree. loss_spawned: the kill
                  -> both workers of the next attempt at the top of their script; loss_ready: ->
                  both with gloo up.

Stall timeouts are the same S for every launcher (cpprun --stall-timeout S; ft_launcher
--ft-rank-heartbeat-timeout S), and the first-progress timeout the same F (cpprun
--stall-first-timeout F when it has it; ft_launcher --ft-initial-rank-heartbeat-timeout F).
cpprun flags the binary does not list in --help are left out and said so. torchrun has no hang
detection but its FileTimer (a trainer-side API, TORCHELASTIC_ENABLE_FILE_TIMER), so its hang
rows are n/a and not run.

Output: a table (median over the runs that produced the figure, and how many) and one line per
figure: `RESULT <name> <cpprun>s ft=<ft_launcher>s torchrun=<torchrun>s ratio=<ft/cpprun>`
(ratio peer/ours as in launch_bench: > 1 means cpprun is faster). Every job is bounded
(--timeout); the benchmark is a child subreaper and kills whatever a job leaves behind. A job
that fails (non-zero exit where success was expected, a missing stamp, the bound) fails the
benchmark (exit 1) unless it is a peer's and --peer-failures-ok is given; every failure is listed.
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "bench", "resilience_worker.py")
VENV = os.environ.get("CPPRUN_TORCH2_VENV", "/opt/cpprun/torch2")
FT_DIR = os.environ.get("CPPRUN_FT_LAUNCHER_DIR", "/opt/cpprun/ft-launcher")
LAUNCHERS = ("cpprun", "ft", "torchrun")
# A launcher's first output line that reports the hang (arrival time at the benchmark).
DETECT_RE = {
    # "rank 0 (local_rank 0, pid 1724) is stalled: no progress for 5.0 s (...)"
    "cpprun": re.compile(r"\) is stalled: "),
    # rank_monitor_server.py: "[Cycle 0] Did not get subsequent heartbeat. Waited 5.00 seconds."
    "ft": re.compile(r"Did not get \w+ heartbeat|Section .* timed out|out-of-section .*timeout",
                     re.I),
    "torchrun": re.compile(r"$^"),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_map():
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(root, kids=None):
    kids = children_map() if kids is None else kids
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def kill_pids(pids):
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def reap_leftovers():
    """Kills and reaps every descendant of the benchmark (zombies of processes the benchmark
    killed come back to it as the subreaper); returns the command lines of live ones."""
    pids = [p for p in tree(os.getpid()) if p != os.getpid()]
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                name = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
            if name:  # empty: a process already exiting
                names.append(name)
        except (OSError, IndexError):
            pass
    kill_pids(pids)
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
            if not [p for p in tree(os.getpid()) if p != os.getpid()]:
                break
    return names


class Proc:
    """One launcher process: output to a file, each line timestamped on arrival."""

    def __init__(self, argv, env, log_path):
        self.argv = argv
        self.log = open(log_path, "w")
        self.lines = []  # (arrival time, line)
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for raw in self.p.stdout:
            now = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append((now, line))
            self.log.write(f"{now:.3f} {line}\n")
        self.log.flush()

    def first_line(self, regex, after):
        for t, line in list(self.lines):
            if t >= after and regex.search(line):
                return t, line
        return None

    def kill_tree(self):
        kill_pids(tree(self.p.pid))

    def wait(self, deadline):
        try:
            return self.p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        self.t.join(timeout=5)
        self.log.close()


def read_events(d):
    try:
        with open(os.path.join(d, "events")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Bench:
    def __init__(self, args):
        self.a = args
        self.python = os.path.join(VENV, "bin", "python")
        self.torchrun = args.torchrun or os.path.join(VENV, "bin", "torchrun")
        self.cpprun = os.path.abspath(args.cpprun)
        self.failures = []
        help_text = subprocess.run([self.cpprun, "--help"], capture_output=True, text=True,
                                   timeout=30).stdout
        self.cpprun_has = {f: f in help_text for f in
                           ("--stall-first-timeout", "--stall-stacks-timeout")}
        self.notes = []
        for flag, has in self.cpprun_has.items():
            if not has:
                self.notes.append(f"cpprun {args.cpprun} has no {flag}: left out")

    def env(self, d, mode, api):
        env = dict(os.environ)
        pp = [os.path.join(REPO, "examples", "python")]
        if api == "ft" or mode == "ft":
            pp.insert(0, os.path.join(FT_DIR, "site"))
        # TMPDIR: the launchers' own temporary files (torchelastic_* log folders, ft_launcher's
        # rank-monitor sockets, cpprun's run folder) stay in the job's folder and go with it.
        tmp = os.path.join(d, "tmp")
        os.makedirs(tmp, exist_ok=True)
        env.update(RB_DIR=d, RB_MODE=mode, RB_API=api, GLOO_SOCKET_IFNAME="lo", TMPDIR=tmp,
                   OMP_NUM_THREADS="1", PYTHON_EXEC=self.python,
                   PYTHONPATH=":".join(pp + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
        return env

    # ---- commands -------------------------------------------------------------------------
    def single_node_argv(self, launcher, mode, d):
        a, s, f = self.a, self.a.stall_timeout, self.a.first_timeout
        hang = mode.startswith("hang")
        if launcher == "cpprun":
            argv = [self.cpprun, "--nproc-per-node=2", "--max-restarts=1",
                    f"--log-dir={d}/logs", f"--event-log={d}/cpprun-events.jsonl"]
            if hang:
                argv.append(f"--stall-timeout={s:g}")
                if self.cpprun_has["--stall-first-timeout"]:
                    argv.append(f"--stall-first-timeout={f:g}")
                if a.cpprun_stall_stacks_timeout and self.cpprun_has["--stall-stacks-timeout"]:
                    argv.append(f"--stall-stacks-timeout={a.cpprun_stall_stacks_timeout}")
            return argv + [WORKER]
        if launcher == "ft":
            argv = [self.python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
                    "--nproc-per-node=2", "--max-restarts=1", "--standalone"]
            if hang:
                argv += [f"--ft-initial-rank-heartbeat-timeout={f:g}",
                         f"--ft-rank-heartbeat-timeout={s:g}"]
            return argv + [WORKER]
        return [self.torchrun, "--nproc-per-node=2", "--max-restarts=1",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}", WORKER]

    def loss_argv(self, launcher, port, i):
        nn = {"cpprun": self.a.loss_nnodes_cpprun, "ft": self.a.loss_nnodes_ft,
              "torchrun": self.a.loss_nnodes_torchrun}[launcher]
        common = [f"--nnodes={nn}", "--nproc-per-node=1", "--max-restarts=3",
                  "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=rbloss",
                  # One address per agent, as on real nodes (ft_launcher closes the rendezvous
                  # when two participants share one).
                  f"--local-addr=127.0.0.{i + 1}"]
        if launcher == "cpprun":
            return [self.cpprun] + common + self.a.cpprun_loss_args.split() + [WORKER]
        if launcher == "ft":
            return [self.python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"] + \
                common + [WORKER]
        return [self.torchrun] + common + [WORKER]

    # ---- one job ---------------------------------------------------------------------------
    def fail(self, launcher, what):
        self.failures.append(f"{launcher}: {what}")
        print(f"  FAILED {launcher}: {what}", flush=True)

    def run_single(self, launcher, mode):
        """Returns {figure: seconds or 'not detected'}; None when the job failed."""
        d = tempfile.mkdtemp(prefix=f"rb-{launcher}-{mode}-", dir=self.a.work_dir)
        api = {"fail": "none", "hang": "cpprun" if launcher == "cpprun" else "ft",
               "hang-unchanged": "none"}[mode]
        if launcher == "ft" and mode == "fail":
            api = "none"
        env = self.env(d, mode, api)
        if launcher == "ft":
            env["PYTHONPATH"] = os.path.join(FT_DIR, "site") + ":" + env["PYTHONPATH"]
        if mode == "hang-unchanged":
            env["RB_HANG_AFTER"] = f"{self.a.stall_timeout + self.a.hang_after_extra:g}"
        argv = self.single_node_argv(launcher, mode, d)
        t0 = time.time()
        proc = Proc(argv, env, os.path.join(d, "launcher.log"))
        deadline = t0 + self.a.timeout
        out, fault_t, n_failed = {}, None, len(self.failures)
        try:
            if mode == "hang-unchanged":
                # Wait for the hang, then for detection within S + grace.
                while time.time() < deadline and proc.p.poll() is None:
                    ev = [e for e in read_events(d) if e["ev"] == "hang"]
                    if ev:
                        fault_t = ev[0]["t"]
                        break
                    early = proc.first_line(DETECT_RE[launcher], t0)
                    if early:
                        # Stalled before the trainer hung (e.g. during `import torch`).
                        proc.kill_tree()
                        proc.wait(time.time() + 10)
                        self.fail(launcher, f"{mode}: false stall {early[0] - t0:.1f} s after "
                                  f"the launch, before the hang: {early[1][:160]} ({d})")
                        return {"unchanged_detected": "false stall"}
                    time.sleep(0.1)
                bound = (fault_t or time.time()) + self.a.stall_timeout + self.a.detect_grace
                detected = None
                while fault_t and time.time() < min(bound, deadline):
                    detected = proc.first_line(DETECT_RE[launcher], fault_t) or \
                        self.next_attempt_start(d, fault_t)
                    if detected or proc.p.poll() is not None:
                        break
                    time.sleep(0.1)
                if fault_t and not detected:
                    out["unchanged_detected"] = "not detected"
                    proc.kill_tree()
                    proc.wait(time.time() + 10)
                    return out
            rc = None
            while time.time() < deadline:
                rc = proc.wait(time.time() + 0.2)
                if rc is not None:
                    break
                events = read_events(d)
                fault = [e["t"] for e in events if e["ev"] in ("fail", "hang")]
                starts = [e["t"] for e in events if fault and e["ev"] == "start" and
                          e["t"] > fault[0]]
                readies = [e for e in events if fault and e["ev"] == "ready" and
                           e["t"] > fault[0]]
                if len(starts) >= 2 and len(readies) < 2 and \
                        time.time() - max(starts) > self.a.ready_bound:
                    proc.kill_tree()
                    proc.wait(time.time() + 10)
                    self.fail(launcher, f"{mode}: the next attempt's process group was not up "
                              f"{self.a.ready_bound:g} s after its start ({d})")
                    if mode == "fail":
                        out["fault_spawned"] = min(starts) - fault[0]
                        out["fault_ready"] = "restarted group stuck"
                    return out
            if rc is None:
                proc.kill_tree()
                proc.wait(time.time() + 10)
                self.fail(launcher, f"{mode}: no end within --timeout {self.a.timeout} s ({d})")
                return None
            events = read_events(d)
            kind = "fail" if mode == "fail" else "hang"
            fault = [e for e in events if e["ev"] == kind]
            if rc != 0 or not fault:
                self.fail(launcher, f"{mode}: exit {rc}, {len(fault)} {kind} stamp(s) ({d})")
                return None
            fault_t = fault[0]["t"]
            starts = sorted(e["t"] for e in events if e["ev"] == "start" and e["t"] > fault_t)
            readies = sorted(e["t"] for e in events if e["ev"] == "ready" and e["t"] > fault_t)
            if len(starts) < 2 or len(readies) < 2:
                self.fail(launcher, f"{mode}: next attempt incomplete ({d})")
                return None
            if mode == "fail":
                out["fault_spawned"] = starts[0] - fault_t
                out["fault_ready"] = readies[1] - fault_t
            else:
                prefix = "hang" if mode == "hang" else "unchanged"
                det = proc.first_line(DETECT_RE[launcher], fault_t)
                if launcher == "cpprun":
                    det_t = self.cpprun_detect_time(d, fault_t) or (det and det[0])
                else:
                    det_t = det and det[0]
                out[f"{prefix}_detected"] = (det_t - fault_t) if det_t else "no message"
                if mode == "hang":
                    out["hang_spawned"] = starts[0] - fault_t
            return out
        finally:
            proc.close()
            left = reap_leftovers()
            if left:
                self.notes.append(f"{launcher} {mode}: left behind, killed: {left}")
            if len(self.failures) == n_failed and not self.a.keep:
                shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def next_attempt_start(d, after):
        starts = [e["t"] for e in read_events(d) if e["ev"] == "start" and e["t"] > after]
        return (min(starts), "next attempt") if starts else None

    @staticmethod
    def cpprun_detect_time(d, after):
        try:
            with open(os.path.join(d, "cpprun-events.jsonl")) as f:
                for line in f:
                    e = json.loads(line)
                    if e.get("event") == "stall_detected" and e["time_us"] / 1e6 >= after:
                        return e["time_us"] / 1e6
        except (FileNotFoundError, ValueError, KeyError):
            pass
        return None

    def run_loss(self, launcher):
        d = tempfile.mkdtemp(prefix=f"rb-{launcher}-loss-", dir=self.a.work_dir)
        env = self.env(d, "loss", "none")
        if launcher == "ft":
            env["PYTHONPATH"] = os.path.join(FT_DIR, "site") + ":" + env["PYTHONPATH"]
        port = free_port()
        t0 = time.time()
        deadline = t0 + self.a.timeout
        agents, n_failed = [], len(self.failures)
        try:
            agents.append(Proc(self.loss_argv(launcher, port, 0), env,
                               os.path.join(d, "agent0.log")))
            # The first agent hosts the store; the others join once it listens.
            while time.time() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if agents[0].p.poll() is not None:
                        break
                    time.sleep(0.05)
            for i in (1, 2):
                agents.append(Proc(self.loss_argv(launcher, port, i), env,
                                   os.path.join(d, f"agent{i}.log")))
            # Both workers up and a few steps done.
            while time.time() < deadline:
                if len([e for e in read_events(d) if e["ev"] == "ready"]) >= 2:
                    break
                if any(a.p.poll() is not None for a in agents):
                    break
                time.sleep(0.1)
            time.sleep(1.0)
            events = read_events(d)
            workers = {e["pid"] for e in events if e["ev"] == "ready"}
            if len(workers) < 2:
                self.fail(launcher, f"loss: the first attempt never had 2 workers up ({d})")
                return None
            kids = children_map()
            active = [i for i, a in enumerate(agents) if workers & set(tree(a.p.pid, kids))]
            victims = [i for i in active if i != 0] or active
            victim = victims[0]
            pids = tree(agents[victim].p.pid, kids)
            os.close(os.open(os.path.join(d, "faulted"), os.O_WRONLY | os.O_CREAT, 0o644))
            t_kill = time.time()
            kill_pids(pids)
            print(f"    killed agent{victim} ({len(pids)} processes); active were {active}",
                  flush=True)
            starts, readies = [], []
            while time.time() < deadline:
                events = read_events(d)
                starts = sorted(e["t"] for e in events if e["ev"] == "start" and e["t"] > t_kill)
                readies = sorted(e["t"] for e in events if e["ev"] == "ready" and e["t"] > t_kill)
                done = [e for e in events if e["ev"] == "done"]
                if len(done) >= 2 or all(a.p.poll() is not None
                                         for i, a in enumerate(agents) if i != victim):
                    break
                time.sleep(0.1)
            rcs = {i: a.wait(min(deadline, time.time() + self.a.end_grace))
                   for i, a in enumerate(agents) if i != victim}
            if len(starts) < 2 or len(readies) < 2:
                self.fail(launcher, f"loss: no next attempt with 2 workers (exits {rcs}) ({d})")
                return None
            bad = {i: rc for i, rc in rcs.items() if rc != 0}
            if bad:
                self.notes.append(f"{launcher} loss: surviving agents' exits {rcs} "
                                  "(None: still running after the workers finished, killed)")
            return {"loss_spawned": starts[1] - t_kill, "loss_ready": readies[1] - t_kill}
        finally:
            for a in agents:
                if a.p.poll() is None:
                    a.kill_tree()
            for a in agents:
                a.wait(time.time() + 10)
                a.close()
            left = reap_leftovers()
            if left:
                self.notes.append(f"{launcher} loss: left behind, killed: {left}")
            if len(self.failures) == n_failed and not self.a.keep:
                shutil.rmtree(d, ignore_errors=True)


ROWS = [
    ("fault_spawned", "fail", "worker exits 1 -> next attempt spawned"),
    ("fault_ready", "fail", "-> workers ready again (gloo up)"),
    ("hang_detected", "hang", "hang, trainer sends progress -> detected"),
    ("hang_spawned", "hang", "hang -> next attempt spawned"),
    ("unchanged_detected", "hang-unchanged", "hang, trainer unchanged -> detected"),
    ("loss_spawned", "loss", "node loss -> spare's attempt running"),
    ("loss_ready", "loss", "node loss -> workers ready (gloo up)"),
]
NOT_RUN = {("torchrun", "hang"): "FileTimer only", ("torchrun", "hang-unchanged"): "no detection"}


def summarize(values, runs):
    nums = [v for v in values if isinstance(v, float)]
    other = [v for v in values if not isinstance(v, float)]
    if nums and not other:
        return f"{statistics.median(nums):.2f} s ({len(nums)})", statistics.median(nums)
    if nums:
        return (f"{statistics.median(nums):.2f} s ({len(nums)}); {len(other)}x {other[0]}",
                statistics.median(nums))
    if other:
        return f"{other[0]} ({len(other)})", None
    return f"failed ({runs})", None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stall-timeout", type=float, default=5.0)
    ap.add_argument("--first-timeout", type=float, default=30.0,
                    help="first-progress timeout F (cpprun --stall-first-timeout, ft_launcher "
                         "--ft-initial-rank-heartbeat-timeout)")
    ap.add_argument("--cpprun-stall-stacks-timeout", default="",
                    help="pass --stall-stacks-timeout VALUE to cpprun (default: its default)")
    ap.add_argument("--detect-grace", type=float, default=10.0,
                    help="unchanged trainer: 'not detected' after --stall-timeout + this")
    ap.add_argument("--hang-after-extra", type=float, default=5.0,
                    help="hang-unchanged: rank 1 hangs no earlier than --stall-timeout + this "
                         "after its start")
    ap.add_argument("--scenarios", default="fail,hang,hang-unchanged,loss")
    ap.add_argument("--launchers", default=",".join(LAUNCHERS))
    ap.add_argument("--cpprun", default=os.path.join(REPO, "build", "cpprun"))
    ap.add_argument("--torchrun", default="")
    ap.add_argument("--loss-nnodes-cpprun", default="2:2")
    ap.add_argument("--loss-nnodes-ft", default="2:3",
                    help="ft_launcher: nodes above MIN become hot spares")
    ap.add_argument("--loss-nnodes-torchrun", default="2:2")
    ap.add_argument("--cpprun-loss-args", default="",
                    help="more cpprun arguments for the loss scenario, e.g. "
                    "'--rdzv-conf=keep_alive_interval=1' (default: none, torchrun's 5 s x 3)")
    ap.add_argument("--timeout", type=float, default=120.0, help="bound of each job, seconds")
    ap.add_argument("--ready-bound", type=float, default=30.0,
                    help="a next attempt whose gloo group is not up this long after its start "
                         "fails the job")
    ap.add_argument("--end-grace", type=float, default=20.0,
                    help="loss: how long surviving agents get to exit once the job is done")
    ap.add_argument("--peer-failures-ok", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep each job's folder")
    ap.add_argument("--work-dir", default=None)
    args = ap.parse_args()

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back to us
    bench = Bench(args)
    launchers = [x for x in args.launchers.split(",") if x]
    if "ft" in launchers and not os.path.isdir(os.path.join(FT_DIR, "site",
                                                            "nvidia_resiliency_ext")):
        sys.exit(f"no ft_launcher in {FT_DIR}/site: run tests/bench/install_ft_launcher.sh")
    scenarios = [x for x in args.scenarios.split(",") if x]
    results = {(l, r[0]): [] for l in launchers for r in ROWS}
    for scenario in scenarios:
        for rep in range(args.runs):
            order = launchers[rep % len(launchers):] + launchers[:rep % len(launchers)]
            for launcher in order:
                if (launcher, scenario) in NOT_RUN:
                    continue
                print(f"{scenario} run {rep + 1}/{args.runs}: {launcher}", flush=True)
                out = bench.run_loss(launcher) if scenario == "loss" else \
                    bench.run_single(launcher, scenario)
                print(f"    {out}", flush=True)
                for name, value in (out or {}).items():
                    results[(launcher, name)].append(value)

    names = {"cpprun": "cpprun", "ft": "ft_launcher 0.7", "torchrun": "torchrun 2.x"}
    print()
    print("| figure | " + " | ".join(names[l] for l in launchers) + " |")
    print("|---|" + "---|" * len(launchers))
    result_lines = []
    for key, scenario, title in ROWS:
        if scenario not in scenarios:
            continue
        cells, meds = [], {}
        for l in launchers:
            if (l, scenario) in NOT_RUN:
                cells.append(NOT_RUN[(l, scenario)])
                meds[l] = "n/a"
                continue
            text, med = summarize(results[(l, key)], args.runs)
            cells.append(text)
            meds[l] = med if med is not None else text.split(" (")[0].replace(" ", "_")
        print(f"| {title} | " + " | ".join(cells) + " |")

        def show(v):
            return f"{v:.3f}s" if isinstance(v, float) else str(v)
        ours = meds.get("cpprun")
        line = f"RESULT {key} {show(ours)}" + "".join(
            f" {l}={show(meds[l])}" for l in launchers if l != "cpprun")
        if isinstance(ours, float) and isinstance(meds.get("ft"), float) and ours > 0:
            line += f" ratio={meds['ft'] / ours:.2f}"
        result_lines.append(line)
    print()
    for line in result_lines:
        print(line)
    for note in bench.notes:
        print(f"note: {note}")
    peers_only = all(not f.startswith("cpprun:") for f in bench.failures)
    if bench.failures:
        print(f"{len(bench.failures)} failed job(s):")
        for f in bench.failures:
            print(f"  {f}")
        if not (args.peer_failures_ok and peers_only):
            sys.exit(1)


if __name__ == "__main__":
    main()
