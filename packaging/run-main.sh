#!/usr/bin/env bash
# Installs what is missing, builds cpprun and runs the main job — the README's first command.
# The main job: cpprun starts CPPRUN_WORKERS (default 2) workers of the bundled C++ trainer,
# cpprun-mnist, which train PyTorch's MNIST example network data-parallel on the shipped
# digits (gloo on CPUs, meeting through the agent's store) for CPPRUN_EPOCHS epochs (default 3),
# checkpointing every epoch.
#
# Light on purpose: it installs only what building and running cpprun and its trainer needs
# (setup.sh --build-only; the tests' peers — PyTorch, Slurm, Open MPI, etcd, the torch 2.x venv —
# are the test command's) and builds only cpprun and cpprun-mnist. It configures the test
# command's preset, `ci`, in the same folder (build/), so that packaging/run-tests.sh afterwards
# compiles only what is left (the tests) and nothing twice under other flags.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/setup.sh --build-only
cmake --preset ci
cmake --build --preset main
checkpoints="${CPPRUN_CHECKPOINT_DIR:-build/mnist-checkpoints}"
mkdir -p "$checkpoints"
build/cpprun --nproc-per-node="${CPPRUN_WORKERS:-2}" --max-restarts=1 \
  build/cpprun-mnist --epochs "${CPPRUN_EPOCHS:-3}" --checkpoint-dir "$checkpoints" \
  --log-interval 25
