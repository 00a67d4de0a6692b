#!/usr/bin/env bash
# The release as packaging/release.sh makes it, into BUILD_DIR/release (the fixture the other
# wheel tests install from): both manylinux_2_28 wheels, the sdist and the .deb, each with a
# checksum that verifies (packaging/build-wheel.sh, which release.sh runs, fails unless auditwheel
# show finds each wheel consistent with manylinux_2_28 or older and needing no library outside
# the policy; wheel_symbols_test.py checks the same with readelf); each wheel is under 8 MiB; each wheel holds cpprun and cpprun-store
# for its architecture and the `cpprun` package; the sdist holds the sources and none of the
# tests; the .deb holds /usr/bin/cpprun.
#
#   release_test.sh SOURCE_DIR BUILD_DIR
# The .deb is CPack's from BUILD_DIR (the test build, already built), not a second build.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
dist=$build/release
tools=${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
fail() { echo "release_test: $*" >&2; exit 1; }
started=$(date +%s)
version=$(sed -n 's/^project(cpprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")

sums=$(CPPRUN_RELEASE_DEB_BUILD=$build timeout 1500 "$src/packaging/release.sh" "$dist" "$build") ||
  fail "packaging/release.sh failed"
[ "$sums" = "$dist/SHA256SUMS" ] || fail "release.sh printed '$sums', not $dist/SHA256SUMS"
(cd "$dist" && sha256sum --check --strict SHA256SUMS) || fail "a checksum does not verify"
echo "release_test: release.sh in $(( $(date +%s) - started )) s:"
ls -l "$dist" | sed 's/^/  /'

for arch in x86_64 aarch64; do
  whl=$dist/cpprun-$version-py3-none-manylinux_2_28_$arch.whl
  [ -f "$whl" ] || fail "no $(basename "$whl")"
  # Small: both binaries stripped (unstripped, zig's debug information makes it 21 MB).
  size=$(stat -c %s "$whl")
  [ "$size" -le $((8 * 1024 * 1024)) ] || fail "$whl is $size bytes, over 8 MiB: are its binaries stripped?"
  listing=$("$tools/bin/python" -m zipfile -l "$whl")
  for member in "cpprun-$version.data/scripts/cpprun" "cpprun-$version.data/scripts/cpprun-store" \
                cpprun/__init__.py cpprun/__main__.py; do
    grep -q "^$member " <<< "$listing" || fail "$whl lacks $member"
  done
done

sdist=$dist/cpprun-$version.tar.gz
members=$(tar -tzf "$sdist")
for member in CMakeLists.txt pyproject.toml launcher/cpprun_main.cc python/cpprun/__main__.py \
              cmake/Wheel.cmake; do
  grep -qx "cpprun-$version/$member" <<< "$members" || fail "the sdist lacks $member"
done
if grep -q "^cpprun-$version/tests/" <<< "$members"; then fail "the sdist holds tests/"; fi

deb=$(ls "$dist"/cpprun_"$version"_*.deb)
contents=$(dpkg-deb --contents "$deb")
grep -q " \./usr/bin/cpprun$" <<< "$contents" || fail "$deb lacks /usr/bin/cpprun"
echo "release_test: passed in $(( $(date +%s) - started )) s"
