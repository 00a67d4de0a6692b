"""mnist_bench: the bundled C++ trainer (cpprun-mnist) against PyTorch 2.x and PyTorch 1.13
training the same net (examples/python/mnist_ddp.py: DDP on gloo), all under cpprun with the same
world size, per-rank batch, threads (cpprun's OMP_NUM_THREADS), optimizer and data, side by side
in one run.

    /usr/bin/python3 tests/bench/mnist_bench.py --cpprun build/cpprun \\
        --trainer build/cpprun-mnist [--nproc 2] [--epochs 3] [--runs 2] \\
        [--accuracy-batch-size 32] [--accuracy-epochs 6] [--target-accuracy 97] \\
        [--fashion-epochs 5] [--fashion /usr/share/datasets/fashion-mnist] \\
        [--peers torch2,torch113] [--torch2-python /opt/cpprun/torch2/bin/python]
        [--trainer-args '--device cuda [--bf16]']

Peers: torch2 = mnist_ddp.py under the pinned torch 2.x (--torch2-python; default
${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}/bin/python), the anchor of the unsuffixed RESULT
lines; torch113 = the same script under /usr/bin/python3 (Debian's torch 1.13), RESULT lines
with the suffix _t113. cpprun runs the script with PYTHON_EXEC set to the peer's python.

Figures (RESULT lines, ours first, then peer= and ratio=ours/peer for throughput, peer/ours for times):
  mnist_images_per_s      training images per second of all ranks (median over epochs 2..E of
                          every run; epoch 1 warms caches), on the shipped digits
  mnist_accuracy_e<E>     test accuracy after the last epoch (of the last run)
  mnist_time_to_97_ws<N>_b<B>
                          seconds from the trainer's start to the end of the first epoch whose
                          test accuracy on the shipped digits is at least 97%, in a separate pass
                          per run with per-rank batch --accuracy-batch-size (default 32: global
                          64, the example's batch; at 2 x 64 the 8k digits leave both trainers
                          just under 97% for 6 epochs) and at most --accuracy-epochs (default 6);
                          median over runs, "not-reached" when a run never got there
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


def run_job(args, trainer_argv, metrics, data=None, epochs=None, python="/usr/bin/python3",
            batch_size=None):
    cmd = [args.cpprun, f"--nproc-per-node={args.nproc}"] + trainer_argv + args.trainer_args.split() + [
        "--epochs", str(epochs), "--batch-size", str(batch_size or args.batch_size), "--quiet",
        "--metrics", metrics]
    if data:
        cmd += ["--data", data]
    env = dict(os.environ, PYTHON_EXEC=python)
    env.pop("OMP_NUM_THREADS", None)  # cpprun sets it: usable CPUs / workers, for both
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"mnist_bench: {' '.join(cmd)} exited {done.returncode}")
    with open(metrics) as f:
        return [r for r in (json.loads(line) for line in f) if r["event"] == "test"]


def result(name, ours, peer, higher_is_better=True, unit=""):
    if ours is None or peer is None:
        def show(v):
            return "not-reached" if v is None else f"{v:.2f}{unit}"
        print(f"RESULT {name} {show(ours)} peer={show(peer)}", flush=True)
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
    p.add_argument("--target-accuracy", type=float, default=97.0,
                   help="accuracy of the mnist_time_to_<A> figure, percent (default 97)")
    p.add_argument("--accuracy-batch-size", type=int, default=32,
                   help="per-rank batch of the time-to-accuracy pass (default 32)")
    p.add_argument("--accuracy-epochs", type=int, default=6,
                   help="epochs of the time-to-accuracy pass (default 6; 0 skips it)")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--peers", default="torch2,torch113",
                   help="any of torch2,torch113 (default: both)")
    p.add_argument("--trainer-args", default="",
                   help="arguments given to every trainer, ours and the peers' (for example "
                   "'--device cuda' or '--device cuda --bf16'; both trainers take them)")
    p.add_argument("--torch2-python", default=os.path.join(
        os.environ.get("CPPRUN_TORCH2_VENV", "/opt/cpprun/torch2"), "bin", "python"))
    args = p.parse_args()
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (epoch 1 is not timed)")
    peers = [x for x in args.peers.split(",") if x]
    if not peers or any(x not in ("torch2", "torch113") for x in peers):
        p.error("--peers takes torch2 and/or torch113")
    if "torch2" in peers and not os.access(args.torch2_python, os.X_OK):
        raise SystemExit(f"mnist_bench: the torch 2.x peer needs {args.torch2_python} (install it "
                         "with packaging/setup.sh, pass --torch2-python, or --peers torch113)")

    # name -> (command, python, RESULT suffix); "ours" runs cpprun-mnist.
    jobs = {"ours": ([args.trainer], "/usr/bin/python3", None)}
    if "torch2" in peers:
        jobs["torch2"] = ([TORCH_SCRIPT], args.torch2_python, "")
    if "torch113" in peers:
        jobs["torch113"] = ([TORCH_SCRIPT], "/usr/bin/python3", "_t113")
    names = list(jobs)
    with tempfile.TemporaryDirectory() as tmp:
        speeds = {name: [] for name in names}
        reach = {name: [] for name in names}
        last = {}
        for run in range(args.runs):
            # Rotate the order every run, so that no trainer always goes first.
            for name in names[run % len(names):] + names[:run % len(names)]:
                cmd, python, _ = jobs[name]
                records = run_job(args, cmd, os.path.join(tmp, f"{name}-{run}.jsonl"),
                                  epochs=args.epochs, python=python)
                speeds[name] += [r["images_per_s"] for r in records[1:]]
                last[name] = records[-1]["accuracy"]
                print(f"# run {run} {name}: images/s per epoch "
                      f"{[round(r['images_per_s']) for r in records]}, accuracy "
                      f"{[round(r['accuracy'], 2) for r in records]}, elapsed "
                      f"{[round(r['elapsed_s'], 1) for r in records]} s", flush=True)
            if args.accuracy_epochs <= 0:
                continue
            for name in names[run % len(names):] + names[:run % len(names)]:
                cmd, python, _ = jobs[name]
                records = run_job(args, cmd, os.path.join(tmp, f"{name}-acc-{run}.jsonl"),
                                  epochs=args.accuracy_epochs, python=python,
                                  batch_size=args.accuracy_batch_size)
                reach[name].append(time_to(records, args.target_accuracy))
                print(f"# run {run} {name}, batch {args.accuracy_batch_size}: accuracy "
                      f"{[round(r['accuracy'], 2) for r in records]}, elapsed "
                      f"{[round(r['elapsed_s'], 1) for r in records]} s", flush=True)

        def reached(name):
            times = reach[name]
            return None if any(t is None for t in times) else statistics.median(times)

        target = f"{args.target_accuracy:g}"
        for peer in names[1:]:
            sfx = jobs[peer][2]
            result(f"mnist_images_per_s_ws{args.nproc}_b{args.batch_size}{sfx}",
                   statistics.median(speeds["ours"]), statistics.median(speeds[peer]))
            result(f"mnist_accuracy_e{args.epochs}{sfx}", last["ours"], last[peer], unit="%")
            if args.accuracy_epochs > 0:
                result(f"mnist_time_to_{target}_ws{args.nproc}_b{args.accuracy_batch_size}{sfx}",
                       reached("ours"), reached(peer), higher_is_better=False, unit="s")

        if args.fashion_epochs > 0:
            fashion = {}
            for name in names:
                cmd, python, _ = jobs[name]
                fashion[name] = run_job(args, cmd, os.path.join(tmp, f"fashion-{name}.jsonl"),
                                        data=args.fashion, epochs=args.fashion_epochs,
                                        python=python)
            for peer in names[1:]:
                sfx = jobs[peer][2]
                for e in range(args.fashion_epochs):
                    result(f"fashion_accuracy_e{e + 1}{sfx}", fashion["ours"][e]["accuracy"],
                           fashion[peer][e]["accuracy"], unit="%")
                result(f"fashion_images_per_s{sfx}",
                       statistics.median(r["images_per_s"] for r in fashion["ours"][1:] or fashion["ours"]),
                       statistics.median(r["images_per_s"] for r in fashion[peer][1:] or fashion[peer]))
                result(f"fashion_time_to_91{sfx}", time_to(fashion["ours"], 91.0),
                       time_to(fashion[peer], 91.0), higher_is_better=False, unit="s")


if __name__ == "__main__":
    main()
