#!/usr/bin/env bash
# Installs what is missing, builds cpprun and runs the main job — the README's first command.
# The main job: cpprun launches a PyTorch DDP script written for torchrun
# (examples/python/ddp_train.py: env:// through the agent's store, gloo on CPU) with
# CPPRUN_WORKERS workers (default 2), unchanged. The bundled C++ MNIST trainer replaces it in a
# later stage.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/setup.sh
cmake --preset default
cmake --build --preset default
# Debian's python3-torch is visible to /usr/bin/python3 only.
PYTHON_EXEC=/usr/bin/python3 build/cpprun --nproc-per-node="${CPPRUN_WORKERS:-2}" \
  examples/python/ddp_train.py --steps 50
