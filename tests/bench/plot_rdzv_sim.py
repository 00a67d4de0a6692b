#!/usr/bin/python3
"""Plots rdzv_sim_bench's --json-out lines (issue 26): time to a closed round, bytes per agent
per round, and the re-form time beyond the last call, against N, per backend.

usage: /usr/bin/python3 tests/bench/plot_rdzv_sim.py RESULTS.jsonl [...] --out docs/images/rdzv-sim.png

A line may carry "variant" ("before", "after"): each variant gets its own curves.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = load(args.results)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    # A row may carry "variant" (e.g. "before", "after": two builds side by side); the
    # variants other than the last listed are dashed.
    variants = []
    for r in rows:
        if r.get("variant", "") not in variants:
            variants.append(r.get("variant", ""))
    for variant in variants:
        style = "-" if variant == variants[-1] else "--"
        for backend, marker in (("tcp", "o"), ("etcd", "s")):
            mine = sorted((r for r in rows
                           if r["backend"] == backend and r.get("variant", "") == variant),
                          key=lambda r: r["n"])
            if not mine:
                continue
            n = [r["n"] for r in mine]
            label = "cpprun TCP store" if backend == "tcp" else "etcd (3 members)"
            if variant:
                label += ", " + variant
            axes[0].plot(n, [r["round_s"] for r in mine], style, marker=marker, label=label)
            axes[1].plot(n, [(r["round_all"]["bytes_out"] + r["round_all"]["bytes_in"]) / r["n"]
                             / 1024 for r in mine], style, marker=marker, label=label)
            axes[2].plot(n, [r["reform_s"] - r["decide_s"] - r["last_call_s"] for r in mine],
                         style, marker=marker, label=label)
    axes[0].set_title("time to a closed round (all N started)")
    axes[0].set_ylabel("s")
    axes[1].set_title("store payload per agent, round 0")
    axes[1].set_ylabel("KiB")
    axes[2].set_title("re-form after the decision, beyond the last call")
    axes[2].set_ylabel("s")
    for ax in axes:
        ax.set_xlabel("agents (N)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)


if __name__ == "__main__":
    main()
