#!/usr/bin/env bash
# Installs NVIDIA's ft_launcher (PyPI nvidia-resiliency-ext, pinned) for the resilience benchmark
# (tests/bench/resilience_bench.py) into a folder OUTSIDE the clone and outside the torch 2.x venv:
#
#   tests/bench/install_ft_launcher.sh    # -> ${CPPRUN_FT_LAUNCHER_DIR:-/opt/cpprun/ft-launcher}
#
# The wheels target CPython 3.12 and glibc 2.39 (manylinux_2_39); the venv here is Python 3.11 on
# glibc 2.36, so pip would refuse to install them. The package is pure Python except its CUPTI
# module (nvrx_cupti_module.*.so, GPU profiling only), so the wheel is downloaded for the 3.12
# platform with --no-deps and unpacked as is, and the few dependencies the launcher and
# RankMonitorClient import on a CPU are installed for the venv's Python next to it. Nothing goes
# into the venv: run it with
#
#   PYTHONPATH=$DIR/site $CPPRUN_TORCH2_VENV/bin/python \
#       -m nvidia_resiliency_ext.fault_tolerance.launcher ...
#
# (the `ft_launcher` console script is nvidia_resiliency_ext.fault_tolerance.launcher:main).
set -euo pipefail

NVRX_VERSION=0.7.0
DIR=${CPPRUN_FT_LAUNCHER_DIR:-/opt/cpprun/ft-launcher}
PY=${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}/bin/python
# What the launcher and the rank monitor client import here (found by importing them), pinned.
DEPS=(pyyaml==6.0.4 psutil==7.2.2 defusedxml==0.7.1 httpx==0.28.1 idna==3.20
      protobuf==7.36.2 grpcio==1.85.3 packaging==25.0)

case "$(realpath -m "$DIR")/" in
  "$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null || echo /nonexistent)"/*)
    echo "install_ft_launcher.sh: $DIR is inside the clone; pick a folder outside it" >&2; exit 2;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_39_x86_64 "nvidia-resiliency-ext==$NVRX_VERSION" -d "$tmp"
rm -rf "$DIR/site.new"
mkdir -p "$DIR/site.new"
"$PY" -m zipfile -e "$tmp"/nvidia_resiliency_ext-"$NVRX_VERSION"-*.whl "$DIR/site.new"
"$PY" -m pip install --no-deps --no-compile --target "$DIR/site.new" "${DEPS[@]}"
rm -rf "$DIR/site"
mv "$DIR/site.new" "$DIR/site"

PYTHONPATH="$DIR/site" "$PY" - <<'PY'
import nvidia_resiliency_ext.fault_tolerance.launcher  # noqa: F401  (the ft_launcher entry point)
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: F401
print("ft_launcher importable")
PY
echo "installed nvidia-resiliency-ext $NVRX_VERSION in $DIR/site"
echo "run: PYTHONPATH=$DIR/site $PY -m nvidia_resiliency_ext.fault_tolerance.launcher --help"
