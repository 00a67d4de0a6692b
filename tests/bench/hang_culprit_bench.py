#!/usr/bin/env python3
"""Hang -> culprit named: cpprun vs NVIDIA's ft_launcher vs torchrun 2.x, the same 4-rank hang, one run.

    tests/bench/install_ft_launcher.sh            # once: ft_launcher outside the clone
    mkdir -p /tmp/hangbench && cp build/cpprun /tmp/hangbench/cpprun
    /opt/cpprun/torch2/bin/python tests/bench/hang_culprit_bench.py --cpprun /tmp/hangbench/cpprun
    #   --runs 3 --stall-timeout 4 --culprit 2 --launchers cpprun,ft,torchrun[,cpprun_progress]

One node, 4 ranks, gloo on the CPU, torch 2.x from $CPPRUN_TORCH2_VENV; the worker is
tests/bench/hang_culprit_worker.py (every launcher runs it as a .py script under the venv's python,
GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1). Each step is one all_reduce of a small tensor and 50 ms
of sleep; at step 10 of the first attempt the culprit rank (--culprit, default 2) appends its
`hang` stamp (wall clock) and stops taking part (time.sleep) while the other ranks block in gloo's
next all_reduce. Every launcher gets --max-restarts=0, so the job ends at the first failure.

  cpprun           the trainer unchanged (no progress call): cpprun's sitecustomize stamps
                   progress and records collectives. cpprun --nproc-per-node=4 --max-restarts=0
                   --log-dir=D/logs --event-log=D/cpprun-events.jsonl --stall-timeout=S
                   [--stall-first-timeout=F] WORKER
  cpprun_progress  (only when listed in --launchers) the same, the trainer also calling
                   examples/python/cpprun_progress.py each step
  ft               ft_launcher cannot see a hang without heartbeats: the worker calls
                   RankMonitorClient.init_workload_monitoring() and send_heartbeat() each step (as
                   tests/bench/resilience_worker.py). ft_launcher --nproc-per-node=4
                   --max-restarts=0 --standalone --ft-initial-rank-heartbeat-timeout=F
                   --ft-rank-heartbeat-timeout=S WORKER
  torchrun         no hang detection: torchrun --nproc-per-node=4 --max-restarts=0
                   --master-addr=127.0.0.1 --master-port=P WORKER, killed (its whole process
                   tree) --stall-timeout + --grace s after the hang; "not named"

Figures, from the culprit's `hang` stamp to the arrival time of a launcher's output line at the
benchmark (and, for cpprun, the event log's time_us):

  first_named_s        -> the first line naming a rank as stalled/hung (cpprun: "rank R (...) is
                       stalled"; ft_launcher: its rank monitor's "Did not get subsequent
                       heartbeat", whose "[workload:G(L) ...]" prefix names the rank)
  first_named_culprit  whether that first named rank is the culprit (count of runs) or a victim
  culprit_named_s      -> the first line naming the culprit as the cause of the failure (cpprun:
                       "attempt N hung: rank R" / "hang: rank R"; ft_launcher names no cause: its
                       first observed failure, torchelastic's "failed (exitcode: X) local_rank: L",
                       counts when L is the culprit, else "victim_named")
  verdict_s            cpprun: -> the stall_verdict event (time_us); verdict_culprit: its culprits
                       == [culprit] and waiting == the other ranks (count of runs)
  root_cause_culprit   the failure report's Root Cause rank ("  rank      : R (local_rank: L)";
                       ft_launcher: its first observed failure's local rank) == culprit (count)
  job_end_s            -> the launcher's exit (torchrun: killed)

Runs: --runs N per launcher, the launchers' order rotating. Output: a table (median over the
runs that produced a number, how many, range), what each run named, and one line per figure:
`RESULT <name> <cpprun> ft=<v> torchrun=<v> ratio=<ft/cpprun>` (non-numbers are words:
not_named, victim_named, n/a, failed; counts are `K_of_N`; a cpprun_progress column, when run,
comes last as `cpprun_progress=<v>`). Every job is bounded (--timeout); the benchmark is a child
subreaper, starts each launcher in its own session, kills every process a job leaves by PID, and
at the end checks /proc for any process of the benchmark's left alive (exit 1 if one is).
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The process-tree and output helpers of the resilience benchmark (same folder).
from resilience_bench import Proc, free_port, reap_leftovers  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "hang_culprit_worker.py")
VENV = os.environ.get("CPPRUN_TORCH2_VENV", "/opt/cpprun/torch2")
FT_DIR = os.environ.get("CPPRUN_FT_LAUNCHER_DIR", "/opt/cpprun/ft-launcher")
LAUNCHERS = ("cpprun", "ft", "torchrun")
TITLES = {"cpprun": "cpprun (trainer unchanged)", "ft": "ft_launcher 0.7 (heartbeats)",
          "torchrun": "torchrun 2.x", "cpprun_progress": "cpprun (cpprun_progress calls)"}

# "rank 0 (local_rank 0, pid 1724) is stalled: no progress for 4.0 s (...)"
CPPRUN_STALLED = re.compile(r"\brank (\d+) \(local_rank \d+, pid \d+\) is stalled")
# "attempt 0 hung: rank 2 did not enter ..." and "the job failed; hang: rank 2 did not enter ..."
CPPRUN_CULPRIT = re.compile(r"\b(?:hung|hang): rank (\d+)\b")
# ft_launcher's rank monitor (one process per local rank; LOCAL_RANK in its log prefix):
# "... [WARNING] [vm] [workload:?(0) infra:?(?)] rank_monitor_server.py:497 [Cycle 0] Did not get
#  subsequent heartbeat. Waited 4.00 seconds."
FT_STALLED = re.compile(r"\[workload:(\S+?)\((\S+?)\) infra:[^\]]*\].*Did not get (?:initial|"
                        r"subsequent) heartbeat")
# torchelastic's first observed failure (ft_launcher and torchrun):
# "... api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 21438) of binary: ..."
ELASTIC_FAILED = re.compile(r"failed \(exitcode: -?\d+\) local_rank: (\d+)")
ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s+: (\d+) \(local_rank: \d+\)")


def read_stamps(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    out.append((parts[0], float(parts[1]), int(parts[2])))
    except FileNotFoundError:
        pass
    return out


def hang_time(path):
    hangs = [t for kind, t, _ in read_stamps(path) if kind == "hang"]
    return hangs[0] if hangs else None


def root_cause_rank(lines):
    """(arrival time, rank) of the "rank : R" line of the last "Root Cause" block, or None."""
    start = None
    for i, (_, line) in enumerate(lines):
        if "Root Cause" in line:
            start = i
    if start is None:
        return None
    for t, line in lines[start:]:
        m = ROOT_CAUSE_RANK.match(line)
        if m:
            return t, int(m.group(1))
    return None


class Bench:
    def __init__(self, a):
        self.a = a
        self.python = os.path.join(VENV, "bin", "python")
        self.torchrun = a.torchrun or os.path.join(VENV, "bin", "torchrun")
        self.cpprun = os.path.abspath(a.cpprun)
        self.failures = []
        self.notes = []
        self.runs = []  # one dict per job: what it named and when
        help_text = subprocess.run([self.cpprun, "--help"], capture_output=True, text=True,
                                   timeout=30).stdout
        self.cpprun_first_timeout = "--stall-first-timeout" in help_text
        if not self.cpprun_first_timeout:
            self.notes.append(f"cpprun {a.cpprun} has no --stall-first-timeout: left out")

    def env(self, d, launcher):
        env = dict(os.environ)
        pp = [os.path.join(REPO, "examples", "python")]
        if launcher == "ft":
            pp.insert(0, os.path.join(FT_DIR, "site"))
        # TMPDIR: the launchers' temporary files (ft_launcher's rank-monitor sockets, torchelastic
        # log folders, cpprun's run folder) stay in the job's folder.
        tmp = os.path.join(d, "tmp")
        os.makedirs(tmp, exist_ok=True)
        api = {"ft": "ft", "cpprun_progress": "cpprun"}.get(launcher, "none")
        env.update(HC_STAMPS=os.path.join(d, "stamps"), HC_API=api,
                   HC_CULPRIT=str(self.a.culprit), HC_HANG_AT=str(self.a.hang_step),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", TMPDIR=tmp,
                   PYTHON_EXEC=self.python,
                   PYTHONPATH=":".join(pp + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
        return env

    def argv(self, launcher, d):
        s, f, n = self.a.stall_timeout, self.a.first_timeout, self.a.nproc
        if launcher in ("cpprun", "cpprun_progress"):
            argv = [self.cpprun, f"--nproc-per-node={n}", "--max-restarts=0",
                    f"--log-dir={d}/logs", f"--event-log={d}/cpprun-events.jsonl",
                    f"--stall-timeout={s:g}"]
            if self.cpprun_first_timeout:
                argv.append(f"--stall-first-timeout={f:g}")
            return argv + [WORKER]
        if launcher == "ft":
            return [self.python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
                    f"--nproc-per-node={n}", "--max-restarts=0", "--standalone",
                    f"--ft-initial-rank-heartbeat-timeout={f:g}",
                    f"--ft-rank-heartbeat-timeout={s:g}", WORKER]
        return [self.torchrun, f"--nproc-per-node={n}", "--max-restarts=0",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}", WORKER]

    def fail(self, launcher, why):
        self.failures.append(f"{launcher}: {why}")
        print(f"    FAILED: {why}", flush=True)

    def run(self, launcher):
        d = tempfile.mkdtemp(prefix=f"hc-{launcher}-", dir=self.a.work_dir)
        stamps = os.path.join(d, "stamps")
        t0 = time.time()
        deadline = t0 + self.a.timeout
        proc = Proc(self.argv(launcher, d), self.env(d, launcher), os.path.join(d, "output.log"))
        n_failed = len(self.failures)
        killed = False
        try:
            hang_t, rc = None, None
            while time.time() < deadline:
                rc = proc.wait(time.time() + 0.05)  # the exit is seen within 50 ms
                if rc is not None:
                    break
                hang_t = hang_t or hang_time(stamps)
                if launcher == "torchrun" and hang_t and \
                        time.time() > hang_t + self.a.stall_timeout + self.a.grace:
                    break
            end_t = time.time()
            if rc is None:
                killed = True
                proc.kill_tree()
                proc.wait(time.time() + 10)
            proc.close()  # the reader thread has every line once the pipe is closed
            hang_t = hang_time(stamps)
            if hang_t is None:
                self.fail(launcher, f"no hang stamp (exit {rc}, {time.time() - t0:.0f} s) ({d})")
                return None
            if launcher != "torchrun" and killed:
                self.fail(launcher, f"no end within --timeout {self.a.timeout:g} s ({d})")
            return self.figures(launcher, proc, d, hang_t, end_t, rc, killed)
        finally:
            if proc.p.poll() is None:
                proc.kill_tree()
                proc.wait(time.time() + 10)
            left = reap_leftovers()
            if left and not (launcher == "torchrun" and killed):
                self.notes.append(f"{launcher}: left behind after its exit, killed: {left}")
            if len(self.failures) == n_failed and not self.a.keep:
                shutil.rmtree(d, ignore_errors=True)

    def figures(self, launcher, proc, d, hang_t, end_t, rc, killed):
        culprit = self.a.culprit
        lines = [(t, line) for t, line in proc.lines]
        out = {"dir": d, "exit": "killed" if killed else rc}
        first = None
        named = []  # ranks in the order the launcher named them stalled/hung
        for t, line in lines:
            if t < hang_t - 1.0:  # nothing before the hang counts (1 s slack: stamp vs arrival)
                continue
            m = None
            if launcher in ("cpprun", "cpprun_progress"):
                m = CPPRUN_STALLED.search(line)
                rank = int(m.group(1)) if m else None
            elif launcher == "ft":
                m = FT_STALLED.search(line)
                if m:
                    g, lr = m.group(1), m.group(2)
                    rank = int(g) if g.isdigit() else int(lr) if lr.isdigit() else None
            if m and rank is not None:
                named.append(rank)
                if first is None:
                    first = (t, rank)
        out["named_order"] = named
        if first:
            out["first_named_s"] = first[0] - hang_t
            out["first_named_rank"] = first[1]
            out["first_named_culprit"] = first[1] == culprit
        else:
            out["first_named_s"] = "not_named"
            out["first_named_culprit"] = "not_named"

        # The culprit named as the cause.
        cause = None
        if launcher in ("cpprun", "cpprun_progress"):
            for t, line in lines:
                m = CPPRUN_CULPRIT.search(line)
                if m:
                    cause = (t, int(m.group(1)))
                    break
            rc_line = root_cause_rank(lines)
        else:
            for t, line in lines:
                m = ELASTIC_FAILED.search(line)
                if m:
                    cause = (t, int(m.group(1)))
                    break
            rc_line = root_cause_rank(lines) or cause
        out["cause_rank"] = cause[1] if cause else None
        if cause is None:
            out["culprit_named_s"] = "not_named"
        elif cause[1] == culprit:
            out["culprit_named_s"] = cause[0] - hang_t
        else:
            out["culprit_named_s"] = "victim_named"
        out["root_cause_rank"] = rc_line[1] if rc_line else None
        out["root_cause_culprit"] = (rc_line[1] == culprit) if rc_line else "not_named"

        if launcher in ("cpprun", "cpprun_progress"):
            verdict = None
            try:
                with open(os.path.join(d, "cpprun-events.jsonl")) as f:
                    for line in f:
                        e = json.loads(line)
                        if e.get("event") == "stall_verdict":
                            verdict = e
                            break
            except (FileNotFoundError, ValueError):
                pass
            if verdict:
                out["verdict_s"] = verdict["time_us"] / 1e6 - hang_t
                ranks = [c.get("rank") for c in verdict.get("culprits", [])]
                others = sorted(r for r in range(self.a.nproc) if r != culprit)
                out["verdict_culprits"] = ranks
                out["verdict_waiting"] = verdict.get("waiting")
                out["verdict_culprit"] = ranks == [culprit] and \
                    sorted(verdict.get("waiting") or []) == others
                out["verdict_summary"] = verdict.get("summary")
            else:
                out["verdict_s"] = "no_verdict"
                out["verdict_culprit"] = "no_verdict"
        else:
            out["verdict_s"] = "n/a"
            out["verdict_culprit"] = "n/a"
        out["job_end_s"] = "killed" if killed else end_t - hang_t
        if not killed and launcher != "torchrun" and rc == 0:
            self.fail(launcher, f"exit 0 after a hang ({d})")
        return out


ROWS = [
    ("first_named_s", "hang -> first line naming a rank stalled/hung"),
    ("first_named_culprit", "that first named rank is the culprit"),
    ("culprit_named_s", "hang -> culprit named as the cause"),
    ("verdict_s", "hang -> stall_verdict event (cpprun)"),
    ("verdict_culprit", "verdict culprits == [culprit], waiting == the others"),
    ("root_cause_culprit", "Root Cause / first failure rank == culprit"),
    ("job_end_s", "hang -> launcher exited"),
]


def summarize(values, runs):
    """(table cell, RESULT value) of one figure over the runs."""
    if not values:
        return f"failed ({runs})", "failed"
    bools = [v for v in values if isinstance(v, bool)]
    if bools:
        k = sum(bools)
        words = sorted(set(str(v) for v in values if not isinstance(v, bool)))
        extra = "".join(f"; {w} ({sum(1 for v in values if str(v) == w)})" for w in words)
        return f"{k} of {len(values)}{extra}", f"{k}_of_{len(values)}"
    nums = [v for v in values if isinstance(v, float)]
    words = [v for v in values if not isinstance(v, float)]
    if nums:
        med = statistics.median(nums)
        cell = f"{med:.2f} s ({len(nums)}; {min(nums):.2f}-{max(nums):.2f})"
        if words:
            cell += "; " + ", ".join(f"{words.count(w)}x {w}" for w in sorted(set(map(str, words))))
        return cell, med
    counts = {w: words.count(w) for w in words}
    cell = ", ".join(f"{w} ({c})" for w, c in counts.items())
    top = max(counts, key=counts.get)
    return cell, str(top)


def survivors(work_dir, cpprun):
    """Processes anywhere on the machine that belong to this benchmark's jobs."""
    marks = [WORKER, work_dir or "/hc-", "nvidia_resiliency_ext.fault_tolerance", cpprun]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m and m in cmd for m in marks):
            found.append(f"{name}: {cmd[:100]}")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stall-timeout", type=float, default=4.0,
                    help="S: cpprun --stall-timeout, ft_launcher --ft-rank-heartbeat-timeout")
    ap.add_argument("--first-timeout", type=float, default=30.0,
                    help="F: cpprun --stall-first-timeout (when listed), ft_launcher "
                         "--ft-initial-rank-heartbeat-timeout")
    ap.add_argument("--culprit", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--hang-step", type=int, default=10)
    ap.add_argument("--grace", type=float, default=10.0,
                    help="torchrun: killed --stall-timeout + this after the hang")
    ap.add_argument("--launchers", default=",".join(LAUNCHERS),
                    help="of cpprun, ft, torchrun, cpprun_progress")
    ap.add_argument("--cpprun", default=os.path.join(REPO, "build", "cpprun"))
    ap.add_argument("--torchrun", default="")
    ap.add_argument("--timeout", type=float, default=90.0, help="bound of each job, seconds")
    ap.add_argument("--keep", action="store_true", help="keep each job's folder")
    ap.add_argument("--work-dir", default=None)
    a = ap.parse_args()
    if not 0 <= a.culprit < a.nproc:
        sys.exit("--culprit must be a rank below --nproc")

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back to us
    launchers = [x for x in a.launchers.split(",") if x]
    if "ft" in launchers and not os.path.isdir(os.path.join(FT_DIR, "site",
                                                            "nvidia_resiliency_ext")):
        sys.exit(f"no ft_launcher in {FT_DIR}/site: run tests/bench/install_ft_launcher.sh")
    if a.work_dir:
        os.makedirs(a.work_dir, exist_ok=True)
    bench = Bench(a)
    results = {l: [] for l in launchers}
    t_begin = time.time()
    for rep in range(a.runs):
        order = launchers[rep % len(launchers):] + launchers[:rep % len(launchers)]
        for launcher in order:
            print(f"run {rep + 1}/{a.runs}: {launcher}", flush=True)
            out = bench.run(launcher)
            if out is not None:
                results[launcher].append(out)
                show = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()
                        if k not in ("verdict_summary",)}
                print(f"    {show}", flush=True)

    print()
    print(f"# {a.nproc} ranks, culprit rank {a.culprit}, S = {a.stall_timeout:g} s, "
          f"{a.runs} run(s) per launcher, {time.time() - t_begin:.0f} s in all")
    print("| figure | " + " | ".join(TITLES[l] for l in launchers) + " |")
    print("|---|" + "---|" * len(launchers))
    result_lines = []
    for key, title in ROWS:
        cells, vals = [], {}
        for l in launchers:
            cell, val = summarize([r[key] for r in results[l] if key in r], a.runs)
            cells.append(cell)
            vals[l] = val
        print(f"| {title} | " + " | ".join(cells) + " |")

        def show(v):
            return f"{v:.3f}s" if isinstance(v, float) else str(v)
        line = f"RESULT {key} {show(vals.get('cpprun', 'n/a'))}" + \
            f" ft={show(vals.get('ft', 'n/a'))} torchrun={show(vals.get('torchrun', 'n/a'))}"
        ours, ft = vals.get("cpprun"), vals.get("ft")
        if isinstance(ours, float) and isinstance(ft, float) and ours > 0:
            line += f" ratio={ft / ours:.2f}"
        else:
            line += " ratio=n/a"
        if "cpprun_progress" in vals:
            line += f" cpprun_progress={show(vals['cpprun_progress'])}"
        result_lines.append(line)
    print()
    print("What each run named (ranks in the order named stalled/hung; cause: the rank named "
          "as the culprit / first failure; root cause rank):")
    for l in launchers:
        for i, r in enumerate(results[l]):
            print(f"  {l} run {i + 1}: named {r['named_order'] or 'nothing'}, first "
                  f"{r.get('first_named_rank', '-')}, cause {r['cause_rank']}, root cause "
                  f"{r['root_cause_rank']}, exit {r['exit']}"
                  + (f", verdict culprits {r.get('verdict_culprits')} waiting "
                     f"{r.get('verdict_waiting')}" if 'verdict_culprits' in r else ""))
    print()
    for line in result_lines:
        print(line)
    for note in bench.notes:
        print(f"note: {note}")
    left = reap_leftovers()
    alive = survivors(a.work_dir, bench.cpprun)
    print(f"processes left behind: {left + alive if (left or alive) else 'none'}")
    if bench.failures:
        print(f"{len(bench.failures)} failed job(s):")
        for f in bench.failures:
            print(f"  {f}")
    if bench.failures or alive:
        sys.exit(1)


if __name__ == "__main__":
    main()
