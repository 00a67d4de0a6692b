#!/usr/bin/env bash
# Installs what is missing, builds cpprun and runs the main job. This is the README's first
# command. Until the launcher lands, the main job is the store demo: cpprun-store plus two
# PyTorch gloo workers that rendezvous through it (examples/store/demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/setup.sh
cmake --preset default
cmake --build --preset default
examples/store/demo.sh build "${CPPRUN_WORKERS:-2}"
