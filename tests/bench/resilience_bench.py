#!/usr/bin/env python3
"""Resilience: cpprun vs NVIDIA's ft_launcher vs torchrun 2.x, the same 2-rank gloo worker, one run.

    tests/bench/install_ft_launcher.sh          # once: ft_launcher outside the clone
    tests/bench/resilience_bench.py             # --runs 3 --stall-timeout 5
    tests/bench/resilience_bench.py --scenarios fail,fail-heavy,loss \
        --launchers cpprun,cpprun-warm,ft,torchrun   # warm restarts, cold vs warm

Launchers (--launchers): cpprun (cold), cpprun-warm (cpprun --warm-restart: a restarted Python
worker is forked from a warm process that imported what attempt 0's workers imported; default
only when `cpprun --help` lists the flag), ft (ft_launcher), torchrun.

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
  fail-heavy      fail with the heavy-import trainer (the worker imports a large set of installed
                  packages before init_process_group, RB_HEAVY=1: see resilience_worker.py;
                  3-7 s here): figures with the suffix _heavy. --heavy-imports adds the -heavy
                  variant of each fail/loss scenario given; loss-heavy is loss with it.
                  Both fail scenarios also give the workers' own figures: worker_imports_first /
                  _restarted (top of script -> torch imported, attempt 0 / next attempt; ~0 when
                  forked warm), worker_rss (VmRSS at ready, attempt 0) and, for cpprun-warm,
                  warm_process_rss / _pss (peak VmRSS / Pss, /proc/PID/status and smaps_rollup, of
                  the process whose command line has "cpprun-warm" and whose parent's has not,
                  sampled every 0.2 s). cpprun-warm's rank 1 fails only once its warm process
                  is ready (--warm-ready-timeout), as in a job that has run a while: cpprun's
                  "warm process N is ready" line, or the warm process idle after >= 0.5 s of CPU.
  loss            3 agents on loopback, c10d rendezvous, 1 worker each, 2 needed
                  (--loss-nnodes-cpprun/-ft/-torchrun: 2:2, 2:3, 2:2; the third is the spare);
                  once both workers are up and have run a second, the benchmark SIGKILLs
                  (SIGSTOP first, so nothing reacts half-killed) one active agent that does
                  not host the store, with its whole tree. loss_spawned: the kill
                  -> both workers of the next attempt at the top of their script; loss_ready: ->
                  both with gloo up; loss_worker_imports: the next attempt's workers' imports.
                  cpprun-warm: the kill waits until every agent's warm process (the spare's
                  pre-warmed one too) is ready, at most --warm-ready-timeout (noted).

Stall timeouts are the same S for every launcher (cpprun --stall-timeout S; ft_launcher
--ft-rank-heartbeat-timeout S), and the first-progress timeout the same F (cpprun
--stall-first-timeout F when it has it; ft_launcher --ft-initial-rank-heartbeat-timeout F).
cpprun flags the binary does not list in --help are left out and said so. torchrun has no hang
detection but its FileTimer (a trainer-side API, TORCHELASTIC_ENABLE_FILE_TIMER), so its hang
rows are n/a and not run.

Output: a table (median over the runs that produced the figure, how many, min-max) and one line
per figure: `RESULT <name> <cpprun> s cpprun-warm=<v> ft=<v> torchrun=<v> ratio=<ft/cpprun>
ratio_torchrun=<torchrun/cpprun>`, and with cpprun-warm `RESULT <name>_warm <cpprun-warm> s
cpprun=<cold> ft=<v> torchrun=<v> ratio=<cold/warm> ratio_ft=<ft/warm> ratio_torchrun=<..>`
(ratio peer/ours as in launch_bench: > 1 means ours is faster); memory: `RESULT
warm_process_rss[_heavy] <MiB> MiB peer=<one cold cpprun worker's VmRSS> pss=<MiB>
ratio=<warm/worker>`. Non-numbers are words (failed, not_detected, n/a). Every job is bounded
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
LAUNCHERS = ("cpprun", "cpprun-warm", "ft", "torchrun")
# The worker variants: a scenario "<mode>-heavy" runs the worker of <mode> with RB_HEAVY=1 (the
# heavy-import trainer); its figures carry the suffix _heavy.
HEAVY_SCENARIOS = ("fail-heavy", "loss-heavy")
# What a warm process has in its command line (cpprun --warm-restart).
WARM_TAGS = (b"cpprun-warm",)
# cpprun's line once a warm process has imported attempt 0's packages.
WARM_READY_RE = re.compile(r"warm process \d+ is ready")


def base(launcher):
    """cpprun-warm is cpprun with --warm-restart: same flags, detection, progress API."""
    return "cpprun" if launcher == "cpprun-warm" else launcher


def split_scenario(scenario):
    """'fail-heavy' -> ('fail', True); 'hang-unchanged' -> ('hang-unchanged', False)."""
    if scenario.endswith("-heavy"):
        return scenario[:-len("-heavy")], True
    return scenario, False
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


def memory_kib(pid):
    """(VmRSS, Pss) of pid in KiB (Pss from /proc/PID/smaps_rollup); None where unreadable."""
    rss = pss = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


class WarmSampler:
    """Peak VmRSS and Pss of cpprun's warm processes: a descendant of a launcher process (never
    the launcher itself) whose command line has one of WARM_TAGS and whose parent is not such a
    process (the workers it forks inherit its command line); pids in `exclude` (the workers,
    from their stamps) never count."""

    # A warm process counts as ready (its imports done) once it has used this much CPU and
    # then none for IDLE_S (cpprun logs "warm process N is ready" only when it forks from it).
    BUSY_S, IDLE_S = 0.5, 2.0

    def __init__(self):
        self.peak = {}  # pid -> [rss_kib, pss_kib, parent pid]
        self.cpu = {}  # pid -> (CPU seconds, when they last changed)

    def ready(self):
        """pids of the warm processes that look ready (see BUSY_S)."""
        now = time.time()
        return [pid for pid, (cpu, since) in self.cpu.items()
                if cpu >= self.BUSY_S and now - since >= self.IDLE_S]

    def _cpu(self, pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return
        old = self.cpu.get(pid)
        if old is None or cpu != old[0]:
            self.cpu[pid] = (cpu, time.time())

    def sample(self, roots, exclude=()):
        kids = children_map()
        parent = {c: p for p, cs in kids.items() for c in cs}

        def tagged(pid):
            line = cmdline(pid)
            return pid not in roots and any(t in line for t in WARM_TAGS)
        for root in roots:
            for pid in tree(root, kids):
                if pid in exclude or not tagged(pid) or tagged(parent.get(pid, 0)):
                    continue
                rss, pss = memory_kib(pid)
                if rss is None:
                    continue
                self._cpu(pid)
                peak = self.peak.setdefault(pid, [0, 0, parent.get(pid)])
                peak[0] = max(peak[0], rss)
                peak[1] = max(peak[1], pss or 0)

    def rss_mib(self):
        """(median of the warm processes' peak VmRSS, same of Pss) in MiB, or (None, None)."""
        if not self.peak:
            return None, None
        return (statistics.median(v[0] for v in self.peak.values()) / 1024,
                statistics.median(v[1] for v in self.peak.values()) / 1024)


def worker_pids(events):
    return {e["pid"] for e in events if "pid" in e}


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
                           ("--stall-first-timeout", "--stall-stacks-timeout", "--warm-restart")}
        self.notes = []
        for flag, has in self.cpprun_has.items():
            if not has and flag != "--warm-restart":
                self.notes.append(f"cpprun {args.cpprun} has no {flag}: left out")

    def cpprun_argv(self, launcher):
        argv = [self.cpprun]
        if launcher == "cpprun-warm":
            argv += ["--warm-restart"] + self.a.cpprun_warm_args.split()
        return argv

    def env(self, d, mode, api, heavy=False):
        env = dict(os.environ)
        pp = [os.path.join(REPO, "examples", "python")]
        if api == "ft" or mode == "ft":
            pp.insert(0, os.path.join(FT_DIR, "site"))
        # TMPDIR: the launchers' own temporary files (torchelastic_* log folders, ft_launcher's
        # rank-monitor sockets, cpprun's run folder) stay in the job's folder and go with it.
        tmp = os.path.join(d, "tmp")
        os.makedirs(tmp, exist_ok=True)
        env.update(RB_DIR=d, RB_MODE=mode, RB_API=api, GLOO_SOCKET_IFNAME="lo", TMPDIR=tmp,
                   OMP_NUM_THREADS="1", PYTHON_EXEC=self.python, RB_HEAVY="1" if heavy else "0",
                   PYTHONPATH=":".join(pp + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
        if self.a.heavy_modules:
            env["RB_HEAVY_MODULES"] = self.a.heavy_modules
        return env

    # ---- commands -------------------------------------------------------------------------
    def single_node_argv(self, launcher, mode, d):
        a, s, f = self.a, self.a.stall_timeout, self.a.first_timeout
        hang = mode.startswith("hang")
        if base(launcher) == "cpprun":
            argv = self.cpprun_argv(launcher) + ["--nproc-per-node=2", "--max-restarts=1",
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
              "torchrun": self.a.loss_nnodes_torchrun}[base(launcher)]
        common = [f"--nnodes={nn}", "--nproc-per-node=1", "--max-restarts=3",
                  "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=rbloss",
                  # One address per agent, as on real nodes (ft_launcher closes the rendezvous
                  # when two participants share one).
                  f"--local-addr=127.0.0.{i + 1}"]
        if base(launcher) == "cpprun":
            return self.cpprun_argv(launcher) + common + self.a.cpprun_loss_args.split() + \
                [WORKER]
        if launcher == "ft":
            return [self.python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"] + \
                common + [WORKER]
        return [self.torchrun] + common + [WORKER]

    # ---- one job ---------------------------------------------------------------------------
    def fail(self, launcher, what, procs=()):
        # The launcher's last line says why it ended (e.g. "unknown option").
        for p in procs:
            if p.lines:
                what += f"; its last line: {p.lines[-1][1][:200]}"
                break
        self.failures.append(f"{launcher}: {what}")
        print(f"  FAILED {launcher}: {what}", flush=True)

    def note_warm(self, launcher, tag, procs, sampler):
        """cpprun-warm: whether a warm process was seen, and cpprun's lines about it (e.g. why
        it fell back to a cold start), once per distinct text."""
        if sampler is None:
            return
        if not sampler.peak:
            self.note_once(f"{launcher} {tag}: no warm process seen (no descendant with "
                           f"{' or '.join(t.decode() for t in WARM_TAGS)} in its command line)")
        for p in procs:
            for _, line in p.lines:
                if re.search(r"warm", line, re.I):
                    self.note_once(f"{launcher} {tag}: {line[:240]}")

    def note_once(self, text):
        if text not in self.notes:
            self.notes.append(text)

    def run_scenario(self, launcher, scenario):
        """Runs one job of scenario; figures of a -heavy scenario get the suffix _heavy."""
        mode, heavy = split_scenario(scenario)
        sampler = WarmSampler() if launcher == "cpprun-warm" else None
        if mode == "loss":
            out = self.run_loss(launcher, heavy, sampler)
        else:
            out = self.run_single(launcher, mode, heavy, sampler)
        if out is None:
            return None
        return {(k + "_heavy" if heavy else k): v for k, v in out.items()}

    @staticmethod
    def worker_figures(events, fault_t, out):
        """The workers' own figures: imports before and after the fault, RSS at attempt 0."""
        first = [e["dur"] for e in events if e["ev"] == "imported" and e["t"] < fault_t]
        later = [e["dur"] for e in events if e["ev"] == "imported" and e["t"] > fault_t]
        rss = [e["rss_kib"] / 1024 for e in events
               if e["ev"] == "ready" and e["t"] < fault_t and e.get("rss_kib")]
        if first:
            out["worker_imports_first"] = statistics.median(first)
        if later:
            out["worker_imports_restarted"] = statistics.median(later)
        if rss:
            out["worker_rss"] = statistics.median(rss)

    @staticmethod
    def warm_figures(sampler, out):
        if sampler is None:
            return
        rss, pss = sampler.rss_mib()
        out["warm_process_rss"] = rss if rss is not None else "no warm process"
        out["warm_process_pss"] = pss if pss is not None else "no warm process"

    def run_single(self, launcher, mode, heavy=False, sampler=None):
        """Returns {figure: seconds or 'not detected'}; None when the job failed."""
        tag = mode + ("-heavy" if heavy else "")
        d = tempfile.mkdtemp(prefix=f"rb-{launcher.replace('-', '_')}-{tag}-",
                             dir=self.a.work_dir)
        api = {"fail": "none", "hang": "cpprun" if base(launcher) == "cpprun" else "ft",
               "hang-unchanged": "none"}[mode]
        env = self.env(d, mode, api, heavy)
        if launcher == "ft":
            env["PYTHONPATH"] = os.path.join(FT_DIR, "site") + ":" + env["PYTHONPATH"]
        if mode == "hang-unchanged":
            env["RB_HANG_AFTER"] = f"{self.a.stall_timeout + self.a.hang_after_extra:g}"
        elif mode == "fail" and self.a.fault_after:
            env["RB_HANG_AFTER"] = f"{self.a.fault_after:g}"
        gate = sampler is not None and mode == "fail" and self.a.warm_ready_timeout > 0
        if gate:
            # Rank 1 fails once the warm process is ready (as in a job that ran a while).
            env["RB_FAULT_GATE"] = "1"
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
                    early = proc.first_line(DETECT_RE[base(launcher)], t0)
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
                    detected = proc.first_line(DETECT_RE[base(launcher)], fault_t) or \
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
                if gate and self.open_gate(d, [proc], sampler, t0, 1, f"{launcher} {tag}"):
                    gate = False
                events = read_events(d)
                if sampler:
                    sampler.sample([proc.p.pid], worker_pids(events))
                fault = [e["t"] for e in events if e["ev"] in ("fail", "hang")]
                starts = [e["t"] for e in events if fault and e["ev"] == "start" and
                          e["t"] > fault[0]]
                readies = [e for e in events if fault and e["ev"] == "ready" and
                           e["t"] > fault[0]]
                if len(starts) >= 2 and len(readies) < 2 and \
                        time.time() - max(starts) > self.a.ready_bound:
                    proc.kill_tree()
                    proc.wait(time.time() + 10)
                    self.fail(launcher, f"{tag}: the next attempt's process group was not up "
                              f"{self.a.ready_bound:g} s after its start ({d})")
                    if mode == "fail":
                        out["fault_spawned"] = min(starts) - fault[0]
                        out["fault_ready"] = "restarted group stuck"
                    return out
            if rc is None:
                proc.kill_tree()
                proc.wait(time.time() + 10)
                self.fail(launcher, f"{tag}: no end within --timeout {self.a.timeout} s ({d})",
                          [proc])
                return None
            events = read_events(d)
            kind = "fail" if mode == "fail" else "hang"
            fault = [e for e in events if e["ev"] == kind]
            if rc != 0 or not fault:
                self.fail(launcher, f"{tag}: exit {rc}, {len(fault)} {kind} stamp(s) ({d})",
                          [proc])
                return None
            fault_t = fault[0]["t"]
            starts = sorted(e["t"] for e in events if e["ev"] == "start" and e["t"] > fault_t)
            readies = sorted(e["t"] for e in events if e["ev"] == "ready" and e["t"] > fault_t)
            if len(starts) < 2 or len(readies) < 2:
                self.fail(launcher, f"{tag}: next attempt incomplete ({d})", [proc])
                return None
            if mode == "fail":
                out["fault_spawned"] = starts[0] - fault_t
                out["fault_ready"] = readies[1] - fault_t
                self.worker_figures(events, fault_t, out)
                self.warm_figures(sampler, out)
            else:
                prefix = "hang" if mode == "hang" else "unchanged"
                det = proc.first_line(DETECT_RE[base(launcher)], fault_t)
                if base(launcher) == "cpprun":
                    det_t = self.cpprun_detect_time(d, fault_t) or (det and det[0])
                else:
                    det_t = det and det[0]
                out[f"{prefix}_detected"] = (det_t - fault_t) if det_t else "no message"
                if mode == "hang":
                    out["hang_spawned"] = starts[0] - fault_t
            return out
        finally:
            proc.close()
            self.note_warm(launcher, tag, [proc], sampler)
            left = reap_leftovers()
            if left:
                self.notes.append(f"{launcher} {tag}: left behind, killed: {left}")
            if len(self.failures) == n_failed and not self.a.keep:
                shutil.rmtree(d, ignore_errors=True)

    def open_gate(self, d, procs, sampler, t0, need, what):
        """Creates RB_DIR/go (the fault may come) once `need` warm processes are ready (by
        procs' lines, or by sampler.ready()), or --warm-ready-timeout s after t0 (noted); True
        once open."""
        ready = max(sum(1 for p in procs if p.first_line(WARM_READY_RE, 0)),
                    len(sampler.ready()))
        late = time.time() - t0 > self.a.warm_ready_timeout
        if ready < need and not late:
            return False
        if ready < need:
            self.note_once(f"{what}: {ready} of {need} warm processes ready within "
                           f"--warm-ready-timeout {self.a.warm_ready_timeout:g} s; fault anyway")
        os.close(os.open(os.path.join(d, "go"), os.O_WRONLY | os.O_CREAT, 0o644))
        return True

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

    def run_loss(self, launcher, heavy=False, sampler=None):
        tag = "loss" + ("-heavy" if heavy else "")
        d = tempfile.mkdtemp(prefix=f"rb-{launcher.replace('-', '_')}-{tag}-",
                             dir=self.a.work_dir)
        env = self.env(d, "loss", "none", heavy)
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
            roots = [a.p.pid for a in agents]
            while time.time() < deadline:
                events = read_events(d)
                if sampler:
                    sampler.sample(roots, worker_pids(events))
                if len([e for e in events if e["ev"] == "ready"]) >= 2:
                    break
                if any(a.p.poll() is not None for a in agents):
                    break
                time.sleep(0.1)
            t_up = time.time()
            while time.time() < deadline:
                # A second of steps; cpprun-warm: and every agent's warm process ready (the
                # spare's too: it pre-warms), bounded by --warm-ready-timeout.
                if sampler:
                    sampler.sample(roots, worker_pids(read_events(d)))
                if time.time() - t_up >= 1.0 and (
                        sampler is None or self.a.warm_ready_timeout <= 0 or
                        self.open_gate(d, agents, sampler, t_up, len(agents),
                                       f"{launcher} {tag}")):
                    break
                time.sleep(0.2)
            events = read_events(d)
            workers = {e["pid"] for e in events if e["ev"] == "ready"}
            if len(workers) < 2:
                self.fail(launcher, f"{tag}: the first attempt never had 2 workers up ({d})",
                          agents)
                return None
            kids = children_map()
            active = [i for i, a in enumerate(agents) if workers & set(tree(a.p.pid, kids))]
            if sampler:
                # Which agents had a warm process before the kill (the spare pre-warms).
                owner = {pid: i for i, a in enumerate(agents) for pid in tree(a.p.pid, kids)}
                warm_by_agent = sorted({owner.get(v[2]) for v in sampler.peak.values()},
                                       key=str)
                self.notes.append(f"{launcher} {tag}: agents with a warm process before the "
                                  f"kill: {warm_by_agent} (active: {active})")
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
                if sampler:
                    sampler.sample(roots, worker_pids(events))
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
                self.fail(launcher, f"{tag}: no next attempt with 2 workers (exits {rcs}) ({d})",
                          [a for i, a in enumerate(agents) if i != victim])
                return None
            bad = {i: rc for i, rc in rcs.items() if rc != 0}
            if bad:
                self.notes.append(f"{launcher} {tag}: surviving agents' exits {rcs} "
                                  "(None: still running after the workers finished, killed)")
            out = {"loss_spawned": starts[1] - t_kill, "loss_ready": readies[1] - t_kill}
            later = [e["dur"] for e in events if e["ev"] == "imported" and e["t"] > t_kill]
            if later:
                out["loss_worker_imports"] = statistics.median(later)
            return out
        finally:
            for a in agents:
                if a.p.poll() is None:
                    a.kill_tree()
            for a in agents:
                a.wait(time.time() + 10)
                a.close()
            self.note_warm(launcher, tag, agents, sampler)
            left = reap_leftovers()
            if left:
                self.notes.append(f"{launcher} {tag}: left behind, killed: {left}")
            if len(self.failures) == n_failed and not self.a.keep:
                shutil.rmtree(d, ignore_errors=True)


# (figure, the scenario's mode, title, unit, launchers that have it (None: all)). A -heavy
# scenario has the same rows as its mode, with the suffix _heavy.
ROWS = [
    ("fault_spawned", "fail", "worker exits 1 -> next attempt spawned", "s", None),
    ("fault_ready", "fail", "-> workers ready again (gloo up)", "s", None),
    ("worker_imports_first", "fail", "worker's imports, attempt 0", "s", None),
    ("worker_imports_restarted", "fail", "worker's imports, next attempt", "s", None),
    ("worker_rss", "fail", "worker VmRSS at ready, attempt 0", "MiB", None),
    ("warm_process_rss", "fail", "warm process: peak VmRSS", "MiB", ("cpprun-warm",)),
    ("warm_process_pss", "fail", "warm process: peak Pss", "MiB", ("cpprun-warm",)),
    ("hang_detected", "hang", "hang, trainer sends progress -> detected", "s", None),
    ("hang_spawned", "hang", "hang -> next attempt spawned", "s", None),
    ("unchanged_detected", "hang-unchanged", "hang, trainer unchanged -> detected", "s", None),
    ("loss_spawned", "loss", "node loss -> spare's attempt running", "s", None),
    ("loss_ready", "loss", "node loss -> workers ready (gloo up)", "s", None),
    ("loss_worker_imports", "loss", "node loss: next attempt's worker imports", "s", None),
]
NOT_RUN = {("torchrun", "hang"): "FileTimer only", ("torchrun", "hang-unchanged"): "no detection"}
NAMES = {"cpprun": "cpprun", "cpprun-warm": "cpprun --warm-restart", "ft": "ft_launcher 0.7",
         "torchrun": "torchrun 2.x"}


def summarize(values, runs, unit):
    nums = [v for v in values if isinstance(v, float)]
    other = [v for v in values if not isinstance(v, float)]
    fmt = "%.2f s" if unit == "s" else "%.0f " + unit
    if nums:
        spread = f"; {min(nums):.2f}-{max(nums):.2f}" if unit == "s" and len(nums) > 1 else ""
        text = f"{fmt % statistics.median(nums)} ({len(nums)}{spread})"
        if other:
            text += f"; {len(other)}x {other[0]}"
        return text, statistics.median(nums)
    if other:
        return f"{other[0]} ({len(other)})", None
    return f"failed ({runs})", None


def show(v, unit):
    if isinstance(v, float):
        return f"{v:.3f}" if unit == "s" else f"{v:.1f}"
    return str(v).replace(" ", "_")


def ratio(peer, ours):
    # None under 1 ms (a warm worker's imports: ~0.2 ms), where a ratio says nothing.
    if isinstance(peer, float) and isinstance(ours, float) and ours >= 0.001:
        return f"{peer / ours:.2f}"
    return None


def result_lines(key, unit, meds, launchers):
    """RESULT <name> <value> <unit> <peer>=<value>... ratio=<peer/ours>...: one line with cold
    cpprun as ours (ratio: ft_launcher's), one named <key>_warm with cpprun --warm-restart as ours
    (ratio: cold cpprun's; ratio_ft, ratio_torchrun)."""
    lines = []
    if key in ("warm_process_rss", "warm_process_rss_heavy"):
        worker_key = key.replace("warm_process_rss", "worker_rss")
        warm, pss = meds["cpprun-warm"].get(key), meds["cpprun-warm"].get(
            key.replace("_rss", "_pss"))
        worker = meds.get("cpprun", meds["cpprun-warm"]).get(worker_key)
        line = f"RESULT {key} {show(warm, unit)} {unit} peer={show(worker, unit)} " \
            f"pss={show(pss, unit)}"
        r = ratio(warm, worker)  # warm process / one cold worker
        return [line + (f" ratio={r}" if r else "")]
    if key.startswith("warm_process_pss"):
        return []
    for ours in ("cpprun", "cpprun-warm"):
        if ours not in launchers:
            continue
        name = key if ours == "cpprun" else key + "_warm"
        line = f"RESULT {name} {show(meds[ours][key], unit)} {unit}" + "".join(
            f" {l}={show(meds[l][key], unit)}" for l in launchers if l != ours)
        if unit == "s":
            if ours == "cpprun":
                peers = [("ratio", "ft"), ("ratio_torchrun", "torchrun")]
            else:
                peers = [("ratio", "cpprun"), ("ratio_ft", "ft"), ("ratio_torchrun", "torchrun")]
            for label, peer in peers:
                r = peer in launchers and ratio(meds[peer][key], meds[ours][key])
                if r:
                    line += f" {label}={r}"
        lines.append(line)
    return lines


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
    ap.add_argument("--scenarios", default="fail,fail-heavy,hang,hang-unchanged,loss",
                    help="of fail, fail-heavy, hang, hang-unchanged, loss, loss-heavy")
    ap.add_argument("--heavy-imports", action="store_true",
                    help="add the -heavy variant of each fail/loss scenario given (the worker "
                         "imports a large real package set before init_process_group)")
    ap.add_argument("--heavy-modules", default="",
                    help="comma-separated modules for the heavy worker (default: its "
                         "HEAVY_MODULES)")
    ap.add_argument("--launchers", default=None,
                    help="of cpprun, cpprun-warm (cpprun --warm-restart), ft, torchrun "
                         "(default: all; cpprun-warm only when cpprun --help lists "
                         "--warm-restart)")
    ap.add_argument("--cpprun", default=os.path.join(REPO, "build", "cpprun"))
    ap.add_argument("--cpprun-warm-args", default="",
                    help="more arguments for cpprun-warm, after --warm-restart")
    ap.add_argument("--warm-ready-timeout", type=float, default=30.0,
                    help="cpprun-warm: the fault (fail: rank 1's exit; loss: the kill) waits "
                         "until cpprun says each warm process is ready, at most this long "
                         "(0: no wait)")
    ap.add_argument("--fault-after", type=float, default=0.0,
                    help="fail: rank 1 exits no earlier than this long after its start (every "
                         "launcher)")
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
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    bench = Bench(args)
    has_warm = bench.cpprun_has["--warm-restart"]
    if args.launchers is None:
        launchers = [l for l in LAUNCHERS if l != "cpprun-warm" or has_warm]
        if not has_warm:
            bench.notes.append(f"cpprun {args.cpprun} has no --warm-restart: cpprun-warm not run")
    else:
        launchers = [x for x in args.launchers.split(",") if x]
    unknown = [l for l in launchers if l not in LAUNCHERS]
    if unknown:
        sys.exit(f"unknown launcher(s) {unknown}: of {', '.join(LAUNCHERS)}")
    if "cpprun-warm" in launchers and not has_warm:
        print(f"warning: cpprun {args.cpprun} --help does not list --warm-restart; its "
              "cpprun-warm jobs will likely fail", flush=True)
    if "ft" in launchers and not os.path.isdir(os.path.join(FT_DIR, "site",
                                                            "nvidia_resiliency_ext")):
        sys.exit(f"no ft_launcher in {FT_DIR}/site: run tests/bench/install_ft_launcher.sh")
    scenarios = []
    for x in args.scenarios.split(","):
        if x and x not in scenarios:
            scenarios.append(x)
        if args.heavy_imports and x in ("fail", "loss") and x + "-heavy" not in scenarios:
            scenarios.append(x + "-heavy")
    known = ("fail", "hang", "hang-unchanged", "loss") + HEAVY_SCENARIOS
    if [x for x in scenarios if x not in known]:
        sys.exit(f"unknown scenario(s) {[x for x in scenarios if x not in known]}: of "
                 f"{', '.join(known)}")
    rows = []  # (key, scenario, title, unit, only)
    for scenario in scenarios:
        mode, heavy = split_scenario(scenario)
        for key, m, title, unit, only in ROWS:
            if m == mode and (only is None or set(only) & set(launchers)):
                rows.append((key + ("_heavy" if heavy else ""), scenario,
                             title + (" [heavy imports]" if heavy else ""), unit, only))
    results = {(l, r[0]): [] for l in launchers for r in rows}
    for scenario in scenarios:
        mode = split_scenario(scenario)[0]
        for rep in range(args.runs):
            order = launchers[rep % len(launchers):] + launchers[:rep % len(launchers)]
            for launcher in order:
                if (base(launcher), mode) in NOT_RUN:
                    continue
                print(f"{scenario} run {rep + 1}/{args.runs}: {launcher}", flush=True)
                out = bench.run_scenario(launcher, scenario)
                print(f"    {out}", flush=True)
                for name, value in (out or {}).items():
                    if (launcher, name) in results:
                        results[(launcher, name)].append(value)

    print()
    print(f"--runs {args.runs}: median (runs that produced the figure; min-max)")
    print("| figure | " + " | ".join(NAMES[l] for l in launchers) + " |")
    print("|---|" + "---|" * len(launchers))
    lines = []
    for key, scenario, title, unit, only in rows:
        cells, meds = [], {}
        for l in launchers:
            if (base(l), split_scenario(scenario)[0]) in NOT_RUN:
                cells.append(NOT_RUN[(base(l), split_scenario(scenario)[0])])
                meds[l] = {key: "n/a"}
                continue
            if only and l not in only:
                cells.append("n/a")
                meds[l] = {key: "n/a"}
                continue
            text, med = summarize(results[(l, key)], args.runs, unit)
            cells.append(text)
            meds[l] = {key: med if med is not None else text.split(" (")[0]}
        print(f"| {title} | " + " | ".join(cells) + " |")
        if key.startswith("warm_process_"):
            continue
        lines += result_lines(key, unit, meds, launchers)
    # The warm process's memory against one cold worker's (same scenario).
    for key, scenario, title, unit, only in rows:
        if key.startswith("warm_process_rss") and "cpprun-warm" in launchers:
            worker_key = key.replace("warm_process_rss", "worker_rss")
            meds = {}
            for l in ("cpprun", "cpprun-warm"):
                if l in launchers:
                    vals = {}
                    for k in (key, key.replace("_rss", "_pss"), worker_key):
                        nums = [v for v in results[(l, k)] if isinstance(v, float)]
                        vals[k] = statistics.median(nums) if nums else \
                            (results[(l, k)] or ["failed"])[0]
                    meds[l] = vals
            lines += result_lines(key, unit, meds, launchers)
    print()
    for line in lines:
        print(line)
    for note in bench.notes:
        print(f"note: {note}")
    ours_failed = [f for f in bench.failures if f.split(":")[0] in ("cpprun", "cpprun-warm")]
    if bench.failures:
        print(f"{len(bench.failures)} failed job(s):")
        for f in bench.failures:
            print(f"  {f}")
        if not (args.peer_failures_ok and not ours_failed):
            sys.exit(1)


if __name__ == "__main__":
    main()
