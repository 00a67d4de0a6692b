#!/usr/bin/env bash
# Installs what is missing, builds cpprun and runs the main job — the README's first command.
# The main job: cpprun starts CPPRUN_WORKERS (default 2) workers of the bundled C++ trainer,
# cpprun-mnist, which train PyTorch's MNIST example network data-parallel on the shipped
# digits (gloo on CPUs, meeting through the agent's store) for CPPRUN_EPOCHS epochs (default 3),
# checkpointing every epoch.
#
# Light on purpose: it installs only what building and running cpprun and its trainer needs
# (setup.sh --build-only; the tests' peers — PyTorch, Slurm, Open MPI, etcd, the torch 2.x venv —
# are the test command's) and builds only cpprun and cpprun-mnist, under the `main` preset
# (build-main/: Release, a unity build, Ninja): on 2 cores that compiles in about a third of the
# time the test command's RelWithDebInfo tree takes. The test command builds its own tree
# (build/, preset ci, with debug info and the tests); neither folder is built twice.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/setup.sh --build-only
cmake --preset main
cmake --build --preset main
checkpoints="${CPPRUN_CHECKPOINT_DIR:-build-main/mnist-checkpoints}"
mkdir -p "$checkpoints"
build-main/cpprun --nproc-per-node="${CPPRUN_WORKERS:-2}" --max-restarts=1 \
  build-main/cpprun-mnist --epochs "${CPPRUN_EPOCHS:-3}" --checkpoint-dir "$checkpoints" \
  --log-interval 25
