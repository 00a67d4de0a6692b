#!/usr/bin/env bash
# Installs what is missing, builds cpprun and runs the main job — the README's first command.
# The main job: cpprun starts CPPRUN_WORKERS (default 2) workers of the bundled C++ trainer,
# cpprun-mnist, which train PyTorch's MNIST example network data-parallel on the shipped
# digits (gloo on CPUs, meeting through the agent's store) for CPPRUN_EPOCHS epochs (default 3),
# checkpointing every epoch.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/setup.sh
cmake --preset default
cmake --build --preset default
checkpoints="${CPPRUN_CHECKPOINT_DIR:-build/mnist-checkpoints}"
mkdir -p "$checkpoints"
build/cpprun --nproc-per-node="${CPPRUN_WORKERS:-2}" --max-restarts=1 \
  build/cpprun-mnist --epochs "${CPPRUN_EPOCHS:-3}" --checkpoint-dir "$checkpoints" \
  --log-interval 25
