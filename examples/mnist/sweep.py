"""Sweep: train cpprun-mnist under cpprun with several worker counts and one threads-per-worker
setting, and plot test loss and accuracy against epoch for each into one PNG and one SVG — the
"plot loss or accuracy as a function of epochs for different numbers of GPUs and cpus-per-task"
that DDP cluster guides leave as an exercise.

    /usr/bin/python3 examples/mnist/sweep.py --cpprun build/cpprun --trainer build/cpprun-mnist \\
        [--workers 1,2,4] [--threads 1] [--epochs 5] [--data DIR] [--out docs/images/mnist-sweep]

Writes OUT.png, OUT.svg and OUT.json (the per-epoch records). Each job is bounded by --timeout.
Needs Debian's python3-matplotlib (/usr/bin/python3).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def train(args, workers, metrics):
    cmd = [args.cpprun, f"--nproc-per-node={workers}", args.trainer, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--threads", str(args.threads), "--quiet",
           "--metrics", metrics]
    if args.data:
        cmd += ["--data", args.data]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"sweep: {' '.join(cmd)} exited {done.returncode}")
    with open(metrics) as f:
        return [r for r in (json.loads(line) for line in f) if r["event"] == "test"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpprun", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads per worker")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--data")
    p.add_argument("--out", default="docs/images/mnist-sweep")
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()
    counts = [int(w) for w in args.workers.split(",")]

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in counts:
            results[w] = train(args, w, os.path.join(tmp, f"w{w}.jsonl"))
            print(f"{w} worker(s): accuracy per epoch "
                  f"{[round(r['accuracy'], 2) for r in results[w]]}, "
                  f"{round(results[w][-1]['images_per_s'])} images/s", flush=True)

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for w in counts:
        epochs = [r["epoch"] for r in results[w]]
        label = f"{w} worker{'s' if w > 1 else ''} x {args.threads} thread{'s' if args.threads > 1 else ''}"
        loss_ax.plot(epochs, [r["test_loss"] for r in results[w]], marker="o", label=label)
        acc_ax.plot(epochs, [r["accuracy"] for r in results[w]], marker="o", label=label)
    loss_ax.set(xlabel="epoch", ylabel="test loss (NLL)", title="Test loss")
    acc_ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_xticks(range(1, args.epochs + 1))
    fig.suptitle(f"cpprun-mnist under cpprun: per-worker batch {args.batch_size}, Adadelta, "
                 f"{args.data or 'shipped digits'}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out + ".png", dpi=110)
    fig.savefig(args.out + ".svg")
    with open(args.out + ".json", "w") as f:
        json.dump({str(w): r for w, r in results.items()}, f, indent=1)
    print(f"wrote {args.out}.png, {args.out}.svg and {args.out}.json")


if __name__ == "__main__":
    main()
