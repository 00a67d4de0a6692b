#!/usr/bin/python3
"""store_scale_bench: the workers' store at scale (issue 26) -- cpprun-store against torch 2.15's
libuv TCPStore server, N ranks' init_process_group bootstrap, in one run.

    /usr/bin/python3 tests/bench/store_scale_bench.py [--build build] [--ranks 1024,4096,16384]
        [--modes paced,burst] [--runs 1] [--idle 16384] [--as-is 1024] [--strace 4096]
        [--json out.json] [--plot docs/images/store_scale.png]

For every N, mode and run, each server is started fresh (alternating which goes first) and
build/tests/bench/store_scale_clients plays N ranks' bootstrap against it (see that file:
handshake, ADD init/, gloo's SET/WAIT/GET, one store-based barrier), then holds the N
connections open while the server is measured:
  wall      seconds from the first connect() until every rank passed the barrier
  cpu       the server process's user + system CPU seconds over that time (/proc/<pid>/stat)
  rss/conn  (VmRSS with N idle connections - VmRSS before) / N, in KiB (store data included)
  peak      VmHWM (peak RSS) of the server, MiB
  overflows ListenOverflows and TCPSynRetrans (TcpExt) during the run (netns-wide; gVisor
            keeps neither), and the connects that took over 1 s, 3 s, 7 s (SYN retries)
  client    the client driver's CPU seconds (when it nears wall, the client is the limit)
--idle N adds a run of N connections that only do the handshake (memory per idle connection).

The libuv server is tests/bench/torch_store_server.py --backend libuv --listen ipv4 (an IPv4
listening socket, backlog 4096 as cpprun's) with LD_PRELOAD=libnumeric_getnameinfo.so: torch
names every accepted client with a blocking getnameinfo() on its loop thread, and this
machine's resolver takes seconds per 127.0.1.x name; the shim makes that lookup numeric.
--as-is N runs it once as torch ships it (dual-stack [::], real lookups) with a 60 s bound.
--strace N counts the servers' system calls (strace -c -f) for one paced run of N ranks.

Prints a table and one line per figure: RESULT <name> <value> <unit> peer=<libuv> ratio=<x>.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH2_PYTHON = "/opt/cpprun/torch2/bin/python"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def proc_cpu_s(pid):
    """(user, system) CPU seconds of the process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime


def proc_mem_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def netstat():
    """TcpExt counters: ListenOverflows, ListenDrops, TCPSynRetrans."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for head, vals in zip(lines[::2], lines[1::2]):
        if head.startswith("TcpExt:"):
            d = dict(zip(head.split()[1:], map(int, vals.split()[1:])))
            return {k: d.get(k, 0) for k in ("ListenOverflows", "ListenDrops", "TCPSynRetrans")}
    return {}


class Server:
    """One store server process, started fresh; ended by its PID."""

    def __init__(self, kind, build, strace_out=None, expected_clients=0):
        self.kind = kind
        env = dict(os.environ)
        if kind == "cpprun":
            cmd = [f"{build}/cpprun-store", "--host", "127.0.0.1", "--port", "0",
                   "--log-level", "warn"]
            if expected_clients:  # as the agent passes its world size
                cmd += ["--expected-clients", str(expected_clients)]
        else:
            cmd = [TORCH2_PYTHON, f"{HERE}/torch_store_server.py", "--backend", "libuv"]
            if kind == "libuv":
                cmd += ["--listen", "ipv4"]
                env["LD_PRELOAD"] = f"{build}/tests/bench/libnumeric_getnameinfo.so"
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, text=True)
        self.port = self._read_port()
        self.strace = None
        if strace_out:
            self.strace = subprocess.Popen(
                ["strace", "-c", "-f", "-o", strace_out, "-p", str(self.proc.pid)],
                stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # strace attaches asynchronously; nothing to synchronise on

    def _read_port(self):
        line = self.proc.stdout.readline()
        m = re.search(r"(?:PORT |:)(\d+)\s*$", line)
        if not m:
            raise RuntimeError(f"{self.kind}: no port line, got {line!r}")
        return int(m.group(1))

    def stop(self):
        if self.strace:
            self.strace.send_signal(signal.SIGINT)
            self.strace.wait(30)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_one(kind, n, mode, script, args, timeout_s=120, strace_out=None):
    server = Server(kind, args.build, strace_out, expected_clients=n)
    try:
        pid = server.proc.pid
        mem0, cpu0, net0 = proc_mem_kib(pid), proc_cpu_s(pid), netstat()
        cli = subprocess.Popen(
            [f"{args.build}/tests/bench/store_scale_clients", "--port", str(server.port),
             "--ranks", str(n), "--mode", mode, "--script", script, "--timeout-s",
             str(timeout_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = cli.stdout.readline()
        mem1, cpu1, net1 = proc_mem_kib(pid), proc_cpu_s(pid), netstat()
        cli.stdin.close()
        _, _, usage = os.wait4(cli.pid, 0)
        cli.returncode = 0  # reaped here
        client_cpu = usage.ru_utime + usage.ru_stime
    finally:
        server.stop()
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return {
        "server": kind, "ranks": n, "mode": mode, "script": script,
        "wall_s": float(fields["wall_s"]), "connected_s": float(fields["connected_s"]),
        "done": int(fields["done"]), "retries": int(fields["connect_retries"]),
        "cpu_s": sum(cpu1) - sum(cpu0), "cpu_user_s": cpu1[0] - cpu0[0],
        "cpu_sys_s": cpu1[1] - cpu0[1], "client_cpu_s": client_cpu,
        "connect_over_1s": int(fields["connect_over_1s"]),
        "connect_over_3s": int(fields["connect_over_3s"]),
        "connect_over_7s": int(fields["connect_over_7s"]),
        "rss_per_conn_kib": (mem1["VmRSS"] - mem0["VmRSS"]) / n,
        "peak_mib": mem1["VmHWM"] / 1024, "rss0_mib": mem0["VmRSS"] / 1024,
        "overflows": net1["ListenOverflows"] - net0["ListenOverflows"],
        "syn_retrans": net1["TCPSynRetrans"] - net0["TCPSynRetrans"],
    }


def median_of(rows, key):
    return statistics.median(r[key] for r in rows)


FIGURES = [("wall_s", "s"), ("connected_s", "s"), ("cpu_s", "s"), ("cpu_user_s", "s"),
           ("cpu_sys_s", "s"), ("client_cpu_s", "s"),
           ("rss_per_conn_kib", "KiB"), ("peak_mib", "MiB"), ("overflows", "count"),
           ("syn_retrans", "count"), ("connect_over_1s", "count"), ("connect_over_3s", "count"),
           ("connect_over_7s", "count")]


def report(results, ranks, modes):
    print(f"\n{'N':>6} {'mode':<6} {'figure':<17} {'cpprun':>10} {'libuv':>10} {'ratio':>7}")
    summary = {}
    for mode in modes:
        for n in ranks:
            ours = [r for r in results if r["server"] == "cpprun" and r["ranks"] == n
                    and r["mode"] == mode and r["script"] == "bootstrap"]
            peer = [r for r in results if r["server"] == "libuv" and r["ranks"] == n
                    and r["mode"] == mode and r["script"] == "bootstrap"]
            if not ours or not peer:
                continue
            for key, unit in FIGURES:
                a, b = median_of(ours, key), median_of(peer, key)
                ratio = a / b if b else float("nan")
                summary[(mode, n, key)] = (a, b)
                print(f"{n:>6} {mode:<6} {key:<17} {a:>10.3f} {b:>10.3f} {ratio:>7.2f}")
                print(f"RESULT store_scale_{mode}_{n}_{key} {a:.4f} {unit} peer={b:.4f} "
                      f"ratio={ratio:.3f}")
    for mode in modes:  # growth: per-rank time and CPU from one N to the next
        for lo, hi in zip(ranks, ranks[1:]):
            for key in ("wall_s", "cpu_s"):
                if (mode, lo, key) not in summary or (mode, hi, key) not in summary:
                    continue
                for i, name in enumerate(("cpprun", "libuv")):
                    g = summary[(mode, hi, key)][i] / summary[(mode, lo, key)][i]
                    print(f"GROWTH {mode} {key} {name} {lo}->{hi}: x{g:.2f} "
                          f"(linear: x{hi / lo:.0f})")
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--build", default=f"{ROOT}/build")
    p.add_argument("--ranks", default="1024,4096,16384")
    p.add_argument("--modes", default="paced,burst")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--idle", type=int, default=16384, help="0: skip")
    p.add_argument("--as-is", type=int, default=1024, help="0: skip")
    p.add_argument("--strace", type=int, default=0, help="0: skip")
    p.add_argument("--json", default="")
    p.add_argument("--plot", default="")
    args = p.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    modes = args.modes.split(",")
    with open("/proc/sys/net/core/somaxconn") as f:
        print(f"net.core.somaxconn = {f.read().strip()}; fd limit = "
              f"{os.sysconf('SC_OPEN_MAX')}")
    results = []
    for run in range(args.runs):
        for n in ranks:
            for mode in modes:
                order = ["cpprun", "libuv"] if run % 2 == 0 else ["libuv", "cpprun"]
                for kind in order:
                    r = run_one(kind, n, mode, "bootstrap", args)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    if args.idle:
        for kind in ("cpprun", "libuv"):
            r = run_one(kind, args.idle, "paced", "connect", args)
            results.append(r)
            print(json.dumps(r), flush=True)
    if args.as_is:
        r = run_one("libuv-as-is", args.as_is, "paced", "bootstrap", args, timeout_s=60)
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.strace:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in ("cpprun", "libuv"):
                out = f"{tmp}/{kind}.strace"
                r = run_one(kind, args.strace, "paced", "bootstrap", args, strace_out=out)
                r["script"] = "strace"
                results.append(r)
                with open(out) as f:
                    r["strace"] = f.read()
                print(f"strace -c -f, {kind}, {args.strace} ranks paced:\n{r['strace']}")
    report(results, ranks, modes)
    for r in results:
        if r["script"] == "connect":
            print(f"IDLE {r['server']} {r['ranks']} connections: "
                  f"{r['rss_per_conn_kib']:.2f} KiB each, cpu {r['cpu_s']:.2f} s")
        if r["server"] == "libuv-as-is":
            print(f"AS-IS libuv {r['ranks']} ranks: {r['done']} done in {r['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, ranks, modes, args.plot)


def plot(results, ranks, modes, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, label) in zip(axes, [("wall_s", "time until every rank is done (s)"),
                                       ("cpu_s", "server CPU (s)"),
                                       ("rss_per_conn_kib", "server RSS per rank (KiB)")]):
        for kind, color in (("cpprun", "tab:blue"), ("libuv", "tab:orange")):
            for mode, style in zip(modes, ("-o", "--s")):
                ys = [median_of([r for r in results if r["server"] == kind and r["ranks"] == n
                                 and r["mode"] == mode and r["script"] == "bootstrap"], key)
                      for n in ranks]
                ax.plot(ranks, ys, style, color=color, label=f"{kind} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (client connections)")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
