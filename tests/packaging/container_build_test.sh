#!/usr/bin/env bash
# The Apptainer definition's build, without Apptainer (not packaged for Debian 12): copies what
# its %files section names into a scratch source tree, runs its %post there in a plain shell
# (setup.sh --build-only, a Release build without tests, cmake --install to a scratch prefix),
# then its %test. What this cannot test: the debian:12 base image itself, --nv and bind mounts.
#
#   container_build_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
def=$src/examples/containers/cpprun.def
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The body of a %section: its lines up to the next %section.
section() { awk -v s="%$1" '$1 == s {on = 1; next} /^%/ {on = 0} on' "$def"; }

while read -r from to; do
  [ -n "$from" ] || continue
  case $to in /opt/cpprun-src/*) ;; *) echo "unexpected %files destination $to" >&2; exit 1 ;; esac
  dest=$scratch/src/${to#/opt/cpprun-src/}
  mkdir -p "$(dirname "$dest")"
  cp -a "$src/$from" "$dest"
done < <(section files)

export CPPRUN_SRC=$scratch/src CPPRUN_BUILD_DIR=$scratch/build CPPRUN_PREFIX=$scratch/prefix
section post > "$scratch/post.sh"
section test > "$scratch/test.sh"
grep -q "cmake --install" "$scratch/post.sh"
start=$SECONDS
bash -e "$scratch/post.sh" > "$scratch/post.log" 2>&1 || { tail -40 "$scratch/post.log" >&2; exit 1; }
echo "container_build_test: %post built and installed in $((SECONDS - start)) s"
[ ! -e "$CPPRUN_BUILD_DIR" ] || { echo "%post left its build directory" >&2; exit 1; }
bash -e "$scratch/test.sh" 2>&1 | tail -5
echo "container_build_test: ok"
