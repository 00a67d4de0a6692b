#!/usr/bin/env bash
# Builds the wheel a user installs with `pip install cpprun-*.whl`: `pip wheel` (PEP 517,
# scikit-build-core, no build isolation: offline, from the wheel-tools venv packaging/setup.sh
# makes) in the CMake folder build/wheel-build (kept: rebuilds are incremental), then
# `auditwheel repair`, which bundles the libraries cpprun links that a base system lacks and
# tags it for this system's glibc (manylinux_2_<glibc minor>; nothing older is claimed).
#
#   packaging/build-wheel.sh [OUT_DIR [BUILD_DIR]]   (default dist/ and build/)
# Prints the repaired wheel's path last.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$src/dist}" && cd "${1:-$src/dist}" && pwd)
build=$(mkdir -p "${2:-$src/build}" && cd "${2:-$src/build}" && pwd)
tools=${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
[ -x "$tools/bin/auditwheel" ] ||
  { echo "build-wheel: no $tools (packaging/setup.sh --wheel-tools makes it)" >&2; exit 1; }
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$tools/bin/pip" wheel \
  --no-build-isolation --no-deps --no-index --disable-pip-version-check \
  --config-settings=build-dir="$build/wheel-build" -w "$raw" "$src" > "$raw/build.log" 2>&1 ||
  { tail -n 40 "$raw/build.log" >&2; echo "build-wheel: pip wheel failed" >&2; exit 1; }
whl=$(ls "$raw"/cpprun-*-py3-none-linux_*.whl)
"$tools/bin/auditwheel" show "$whl" >&2
glibc=$(getconf GNU_LIBC_VERSION | sed -n 's/^glibc 2\.\([0-9]*\)$/\1/p')
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "manylinux_2_${glibc}_$(uname -m)" \
  --only-plat -w "$out" "$whl" >&2
ls -t "$out"/cpprun-*-manylinux_2_"${glibc}"_*.whl | head -n 1
