"""PyTorch DDP MNIST training, written the way cluster guides teach it, run unchanged by cpprun
or by torch's own launcher:

    PYTHON_EXEC=/usr/bin/python3 cpprun --nproc-per-node=2 examples/python/mnist_ddp.py --epochs 5

- init_process_group(init_method="env://"): MASTER_ADDR/MASTER_PORT are the agent's store;
- rank 0 prepares (loads and normalises) the data first, then a barrier, then the others;
- DistributedSampler shards the training set, set_epoch() reshuffles every epoch;
- the learning rate is scaled by the world size (--scale-lr, as the guides do for SGD);
- rank 0 saves the checkpoint; every rank calls destroy_process_group at the end;
- --resume: every rank loads the checkpoint when there is one and goes on after its epoch, so a
  job that cpprun (or torchrun) restarts with --max-restarts picks up where it was.

The model and optimiser are pytorch/examples' MNIST ones (the same as the bundled C++ trainer,
cpprun-mnist). Data: MNIST-format IDX files (.gz or raw) from --data, by default the digits
shipped in examples/mnist/data. The batches are taken from tensors held in memory (what a
DataLoader over a TensorDataset yields, without its per-sample collation cost), so that the
benchmark compares compute with compute. --metrics FILE: rank 0 appends JSON lines in
cpprun-mnist's format.

--device cuda: each rank trains on the GPU its LOCAL_RANK picks, over NCCL, with the data held on
the GPU (what tests/bench/mnist_bench.py compares cpprun-mnist --device cuda with); --bf16
autocasts the forward pass to bfloat16. The default stays cpu (gloo), as the CPU tests expect.

--fail-once RANK:EPOCH injects a fault, for restart tests: in the job's first attempt
(TORCHELASTIC_RESTART_COUNT 0) rank RANK raises an error halfway through epoch EPOCH.
"""
import argparse
import contextlib
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "mnist", "data")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def read_idx(path):
    for candidate in (path, path + ".gz"):
        if os.path.exists(candidate):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(candidate, "rb") as f:
                data = f.read()
            dims = data[3]
            shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
            return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise FileNotFoundError(f"{path}[.gz] not found")


def load_split(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte"))
    x = torch.from_numpy((images.astype(np.float32) / 255.0 - 0.1307) / 0.3081).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


def main():
    parser = argparse.ArgumentParser(description="PyTorch DDP MNIST (cluster-guide style)")
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--scale-lr", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", action="store_true",
                        help="go on from --checkpoint-dir's checkpoint when there is one")
    parser.add_argument("--fail-once", metavar="RANK:EPOCH",
                        help="first attempt only: RANK fails halfway through EPOCH")
    parser.add_argument("--metrics")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                        help="cpu (default: gloo), cuda (the GPU LOCAL_RANK picks, NCCL, the data "
                        "held on the GPU) or auto (cuda when torch sees a GPU)")
    parser.add_argument("--bf16", action="store_true",
                        help="on cuda: autocast to bfloat16 (float accumulation), as cpprun-mnist --bf16")
    args = parser.parse_args()

    run_start = time.perf_counter()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.bf16 and not use_cuda:
        parser.error("--bf16 needs --device cuda")
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)

    # Rank 0 prepares the data first (on a shared filesystem: download or unpack), then the rest.
    if rank == 0:
        train_x, train_y = load_split(args.data, "train")
    dist.barrier()
    if rank != 0:
        train_x, train_y = load_split(args.data, "train")
    test_x, test_y = load_split(args.data, "t10k")
    train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))

    # (torch.autocast("cuda") fails on CPU-only builds even when disabled, so it is made only for --bf16.)
    def autocast():
        return (torch.autocast("cuda", dtype=torch.bfloat16) if args.bf16
                else contextlib.nullcontext())

    model = DDP(Net().to(device), device_ids=[device.index] if use_cuda else None)
    lr = args.lr * (world if args.scale_lr else 1)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    sampler = DistributedSampler(range(len(train_x)), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    metrics = open(args.metrics, "a") if args.metrics and rank == 0 else None

    first_epoch = 1
    checkpoint = os.path.join(args.checkpoint_dir, "mnist_ddp.pt") if args.checkpoint_dir else None
    if args.resume and checkpoint and os.path.exists(checkpoint):
        # Every rank loads the same file (rank 0 wrote it before the attempt ended).
        state = torch.load(checkpoint, map_location=device)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        first_epoch = state["epoch"] + 1
        if rank == 0:
            print(f"Resuming from {checkpoint}: epoch {state['epoch']} done, continuing at epoch "
                  f"{first_epoch}", flush=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # the launcher's attempt
    fail_rank, fail_epoch = map(int, args.fail_once.split(":")) if args.fail_once else (-1, -1)
    if restart != 0:
        fail_rank = -1

    for epoch in range(first_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)
        indices = torch.tensor(list(iter(sampler)), device=device)
        batches = (len(indices) + args.batch_size - 1) // args.batch_size
        model.train()
        start = time.perf_counter()
        for b in range(batches):
            if rank == fail_rank and epoch == fail_epoch and b == batches // 2:
                raise RuntimeError(f"--fail-once: rank {rank} fails at epoch {epoch} batch {b}")
            idx = indices[b * args.batch_size:(b + 1) * args.batch_size]
            optimizer.zero_grad()
            with autocast():
                loss = F.nll_loss(model(train_x[idx]).float(), train_y[idx])
            loss.backward()
            optimizer.step()
            if rank == 0 and not args.quiet and (b % args.log_interval == 0 or b == batches - 1):
                seen = min((b * args.batch_size + len(idx)) * world, len(train_x))
                print(f"Train Epoch: {epoch} [{seen}/{len(train_x)} ({100.0 * (b + 1) / batches:.0f}%)]"
                      f"\tLoss: {loss.item():.6f}", flush=True)
        if use_cuda:
            torch.cuda.synchronize()
        train_seconds = time.perf_counter() - start
        images_per_s = len(indices) * world / train_seconds
        scheduler.step()

        # Every rank evaluates a part of the test set; the sums are all-reduced.
        model.eval()
        part = torch.tensor_split(torch.arange(len(test_x), device=device), world)[rank]
        with torch.no_grad():
            out = model.module(test_x[part])
            sums = torch.tensor([F.nll_loss(out, test_y[part], reduction="sum").item(),
                                 (out.argmax(1) == test_y[part]).sum().item(), len(part)],
                                dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        test_loss, accuracy = sums[0].item() / sums[2].item(), 100.0 * sums[1].item() / sums[2].item()
        if rank == 0:
            if not args.quiet:
                print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {int(sums[1])}/{int(sums[2])}"
                      f" ({accuracy:.2f}%)\n", flush=True)
            if metrics:
                metrics.write(json.dumps({"event": "test", "epoch": epoch, "test_loss": test_loss,
                                          "accuracy": accuracy, "images_per_s": images_per_s,
                                          "train_seconds": train_seconds, "world_size": world,
                                          "elapsed_s": time.perf_counter() - run_start,
                                          "threads": threads, "restart": restart}) + "\n")
                metrics.flush()
            if checkpoint:
                tmp = checkpoint + ".tmp"
                torch.save({"epoch": epoch, "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict()}, tmp)
                os.replace(tmp, checkpoint)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
