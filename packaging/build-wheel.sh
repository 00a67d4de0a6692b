#!/usr/bin/env bash
# Builds the wheels a user installs with `pip install cpprun`: one per architecture, tagged
# manylinux_2_28 (glibc 2.28: RHEL/Rocky/Alma 8 and everything newer, like torch's own wheels).
# For each of x86_64 and aarch64 (Grace Hopper), on this Debian 12 machine:
#   1. packaging/zig-toolchain.sh makes the cross toolchain: zig's clang targeting glibc 2.28,
#      LLVM's libc++ and OpenSSL linked statically, hwloc loaded at run time;
#   2. `pip wheel` (PEP 517, scikit-build-core, no build isolation: offline, from the wheel-tools
#      venv packaging/setup.sh makes) builds in BUILD_DIR/wheel-build-ARCH (kept: rebuilds are
#      incremental);
#   3. `auditwheel show` checks every ELF file against the manylinux policies (symbol versions,
#      libraries outside the policy's whitelist: there are none, so nothing is bundled); a
#      wheel it does not find consistent with manylinux_2_28 or older fails the build, and
#      `wheel tags` tags it manylinux_2_28_ARCH (`auditwheel repair --plat` offers only this
#      machine's architecture's policies, and would bundle nothing).
#
#   packaging/build-wheel.sh [OUT_DIR [BUILD_DIR]]   (default dist/ and build/)
#   CPPRUN_WHEEL_ARCHS="x86_64 aarch64" (the default) picks the architectures.
# Prints each repaired wheel's path, one per line, in that order.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$src/dist}" && cd "${1:-$src/dist}" && pwd)
build=$(mkdir -p "${2:-$src/build}" && cd "${2:-$src/build}" && pwd)
tools=${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
[ -x "$tools/bin/auditwheel" ] ||
  { echo "build-wheel: no $tools (packaging/setup.sh --wheel-tools makes it)" >&2; exit 1; }
policy=manylinux_2_28
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
for arch in ${CPPRUN_WHEEL_ARCHS:-x86_64 aarch64}; do
  started=$(date +%s)
  toolchain=$("$src/packaging/zig-toolchain.sh" "$arch" "$build/zig-$arch")
  # _PYTHON_HOST_PLATFORM: the platform the wheel is for (scikit-build-core tags it so).
  _PYTHON_HOST_PLATFORM=linux-$arch CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    "$tools/bin/pip" wheel --no-build-isolation --no-deps --no-index --disable-pip-version-check \
    --config-settings=build-dir="$build/wheel-build-$arch" \
    --config-settings=cmake.define.CMAKE_TOOLCHAIN_FILE="$toolchain" \
    -w "$raw/$arch" "$src" > "$raw/build-$arch.log" 2>&1 ||
    { tail -n 40 "$raw/build-$arch.log" >&2; echo "build-wheel: pip wheel failed ($arch)" >&2; exit 1; }
  whl=$(ls "$raw/$arch"/cpprun-*-py3-none-linux_"$arch".whl)
  "$tools/bin/auditwheel" show "$whl" > "$raw/show-$arch.txt" 2>&1 ||
    { cat "$raw/show-$arch.txt" >&2; echo "build-wheel: auditwheel show failed ($arch)" >&2; exit 1; }
  cat "$raw/show-$arch.txt" >&2
  # "... is consistent with the following platform tag: "manylinux_2_26_x86_64"." (wrapped)
  consistent=$(tr '\n' ' ' < "$raw/show-$arch.txt" |
    sed -n 's/.*consistent with the following platform tag: "manylinux_2_\([0-9]*\)_'"$arch"'".*/\1/p')
  [ -n "$consistent" ] && [ "$consistent" -le 28 ] ||
    { echo "build-wheel: auditwheel does not find the $arch wheel consistent with ${policy}" >&2; exit 1; }
  grep -q "external shared libraries" "$raw/show-$arch.txt" &&
    { echo "build-wheel: the $arch wheel needs libraries outside the policy (above)" >&2; exit 1; }
  "$tools/bin/python" -m wheel tags --remove --platform-tag "${policy}_$arch" "$whl" > /dev/null
  rm -f "$out"/cpprun-*-"${policy}_$arch".whl
  mv "$raw/$arch"/cpprun-*-"${policy}_$arch".whl "$out/"
  repaired=$(ls "$out"/cpprun-*-"${policy}_$arch".whl)
  echo "build-wheel: $(basename "$repaired"): $(stat -c %s "$repaired") bytes, built in $(( $(date +%s) - started )) s" >&2
  echo "$repaired"
done
