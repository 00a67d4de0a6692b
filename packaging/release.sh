#!/usr/bin/env bash
# Builds everything a release ships into one folder, each file with its SHA-256 in SHA256SUMS:
#   cpprun-VERSION-py3-none-manylinux_2_28_x86_64.whl    pip install cpprun, x86-64 (glibc 2.28+)
#   cpprun-VERSION-py3-none-manylinux_2_28_aarch64.whl   the same for aarch64 (Grace Hopper)
#   cpprun-VERSION.tar.gz                                the sdist (HEAD's files): pip builds it
#                                                        with a C++17 compiler and CMake
#   cpprun_VERSION_amd64.deb                             Debian 12: cpprun, cpprun-store,
#                                                        cpprun-mnist, man page, completion
#
#   packaging/release.sh [DIST_DIR [BUILD_DIR]]     (default dist/ and build/)
# The wheels are built by packaging/build-wheel.sh (in BUILD_DIR), the sdist by `python -m build
# --sdist --no-isolation` (the wheel-tools venv), the .deb by CPack from the `main` preset's tree
# (build-main/: Release), or from CPPRUN_RELEASE_DEB_BUILD, an already built CMake tree (the
# release test uses the test build's). Needs packaging/setup.sh --wheel-tools' tools and
# --build-only's packages plus help2man, dpkg-dev and file (the .deb's man page and
# dependencies). Prints DIST_DIR/SHA256SUMS last.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dist=$(mkdir -p "${1:-$src/dist}" && cd "${1:-$src/dist}" && pwd)
build=$(mkdir -p "${2:-$src/build}" && cd "${2:-$src/build}" && pwd)
tools=${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
version=$(sed -n 's/^project(cpprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
step() { echo "release: $*" >&2; }
fail() { cat "$log" >&2; echo "release: $*" >&2; exit 1; }
rm -f "$dist"/cpprun-"$version"* "$dist"/cpprun_"$version"_* "$dist/SHA256SUMS"

started=$(date +%s)
"$src/packaging/build-wheel.sh" "$dist" "$build" > "$log" 2>&1 || fail "the wheels failed"
step "wheels built in $(( $(date +%s) - started )) s"

# The sdist from the commit's files only (scikit-build-core would take any file git does not
# ignore, tracked or not): HEAD exported by git archive, when the source is a checkout.
started=$(date +%s)
sdist_src=$src
export_dir=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$export_dir"' EXIT
if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
  git -C "$src" archive --format=tar HEAD | tar -x -C "$export_dir"
  sdist_src=$export_dir
  if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
    step "note: the sdist is HEAD's; uncommitted changes are not in it"
  fi
fi
"$tools/bin/python" -m build --sdist --no-isolation --outdir "$dist" "$sdist_src" > "$log" 2>&1 ||
  fail "the sdist failed"
step "sdist built in $(( $(date +%s) - started )) s"

started=$(date +%s)
deb_build=${CPPRUN_RELEASE_DEB_BUILD:-}
if [ -z "$deb_build" ]; then
  deb_build=$src/build-main
  (cd "$src" && cmake --preset main && cmake --build --preset main &&
    cmake --build --preset main --target cpprun-store cpprun-man) > "$log" 2>&1 ||
    fail "building the main preset for the .deb failed"
fi
(cd "$deb_build" && cpack --config "$deb_build/CPackConfig.cmake" -G DEB -B "$dist/.deb") \
  > "$log" 2>&1 || fail "cpack failed"
mv "$dist"/.deb/cpprun_"$version"_*.deb "$dist/"
rm -rf "$dist/.deb"
step ".deb built in $(( $(date +%s) - started )) s"

(cd "$dist" && sha256sum cpprun-"$version"-*.whl cpprun-"$version".tar.gz \
  cpprun_"$version"_*.deb > SHA256SUMS)
[ "$(wc -l < "$dist/SHA256SUMS")" = 4 ] || fail "expected 4 files in $dist: $(ls "$dist")"
echo "$dist/SHA256SUMS"
