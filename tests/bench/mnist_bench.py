"""mnist_bench: the bundled C++ trainer (cpprun-mnist) against PyTorch 1.13 training the same
net (examples/python/mnist_ddp.py: DDP on gloo), both under cpprun with the same world size,
per-rank batch, threads (cpprun's OMP_NUM_THREADS), optimizer and data, side by side in one run.

    /usr/bin/python3 tests/bench/mnist_bench.py --cpprun build/cpprun \\
        --trainer build/cpprun-mnist [--nproc 2] [--epochs 3] [--runs 2] \\
        [--fashion-epochs 5] [--fashion /usr/share/datasets/fashion-mnist]

Figures (RESULT lines, ours first, then peer= and ratio=ours/peer for throughput, peer/ours for times):
  mnist_images_per_s      training images per second of all ranks (median over epochs 2..E of
                          every run; epoch 1 warms caches), on the shipped digits
  mnist_accuracy_e<E>     test accuracy after the last epoch
  fashion_accuracy_e<k>   Fashion-MNIST (Debian's dataset-fashion-mnist, 60k/10k) test accuracy
                          after each epoch
  fashion_time_to_91      seconds from the trainer's start to the end of the first epoch whose
                          test accuracy is at least 91% (or "not reached")
Each job is bounded (--timeout, default 1800 s); a failed job fails the benchmark (exit 1).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_SCRIPT = os.path.join(HERE, "..", "..", "examples", "python", "mnist_ddp.py")


def run_job(args, trainer_argv, metrics, data=None, epochs=None):
    cmd = [args.cpprun, f"--nproc-per-node={args.nproc}"] + trainer_argv + [
        "--epochs", str(epochs), "--batch-size", str(args.batch_size), "--quiet",
        "--metrics", metrics]
    if data:
        cmd += ["--data", data]
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
    env.pop("OMP_NUM_THREADS", None)  # cpprun sets it: usable CPUs / workers, for both
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"mnist_bench: {' '.join(cmd)} exited {done.returncode}")
    with open(metrics) as f:
        return [r for r in (json.loads(line) for line in f) if r["event"] == "test"]


def result(name, ours, peer, higher_is_better=True, unit=""):
    if ours is None or peer is None:
        print(f"RESULT {name} {ours if ours is not None else 'not-reached'}{unit} "
              f"peer={peer if peer is not None else 'not-reached'}{unit}")
        return
    ratio = ours / peer if higher_is_better else peer / ours
    print(f"RESULT {name} {ours:.2f}{unit} peer={peer:.2f}{unit} ratio={ratio:.2f}", flush=True)


def time_to(records, accuracy):
    for r in records:
        if r["accuracy"] >= accuracy:
            return r["elapsed_s"]
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpprun", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--fashion", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--fashion-epochs", type=int, default=5)
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (epoch 1 is not timed)")

    ours_cmd = [args.trainer]
    torch_cmd = [TORCH_SCRIPT]
    with tempfile.TemporaryDirectory() as tmp:
        speeds = {"ours": [], "torch": []}
        last = {}
        for run in range(args.runs):
            for name, cmd in (("ours", ours_cmd), ("torch", torch_cmd)):
                records = run_job(args, cmd, os.path.join(tmp, f"{name}-{run}.jsonl"),
                                  epochs=args.epochs)
                speeds[name] += [r["images_per_s"] for r in records[1:]]
                last[name] = records[-1]["accuracy"]
                print(f"# run {run} {name}: images/s per epoch "
                      f"{[round(r['images_per_s']) for r in records]}, accuracy "
                      f"{[round(r['accuracy'], 2) for r in records]}", flush=True)
        result(f"mnist_images_per_s_ws{args.nproc}_b{args.batch_size}",
               statistics.median(speeds["ours"]), statistics.median(speeds["torch"]))
        result(f"mnist_accuracy_e{args.epochs}", last["ours"], last["torch"], unit="%")

        if args.fashion_epochs > 0:
            fashion = {}
            for name, cmd in (("ours", ours_cmd), ("torch", torch_cmd)):
                fashion[name] = run_job(args, cmd, os.path.join(tmp, f"fashion-{name}.jsonl"),
                                        data=args.fashion, epochs=args.fashion_epochs)
            for e in range(args.fashion_epochs):
                result(f"fashion_accuracy_e{e + 1}", fashion["ours"][e]["accuracy"],
                       fashion["torch"][e]["accuracy"], unit="%")
            result("fashion_images_per_s",
                   statistics.median(r["images_per_s"] for r in fashion["ours"][1:] or fashion["ours"]),
                   statistics.median(r["images_per_s"] for r in fashion["torch"][1:] or fashion["torch"]))
            result("fashion_time_to_91", time_to(fashion["ours"], 91.0),
                   time_to(fashion["torch"], 91.0), higher_is_better=False, unit="s")


if __name__ == "__main__":
    main()
