#!/usr/bin/env bash
# Makes one of the Debian roots the wheels are built and tested with, by mmdebstrap from the
# Debian mirror this machine uses, under ${CPPRUN_SYSROOTS:-/opt/cpprun/sysroots}/NAME
# (outside the clone, once per machine, like the venvs packaging/setup.sh makes):
#
#   bookworm-arm64-deps  Debian 12's arm64 OpenSSL and hwloc headers and static libraries, only
#                        unpacked (no foreign program runs): what packaging/zig-toolchain.sh
#                        links the aarch64 wheel against.
#   bullseye-torch       Debian 11 (glibc 2.31, Python 3.9, torch 1.7) as a chroot: the x86_64
#                        wheel installed into its own venv runs a two-worker DDP job there
#                        (tests/packaging/old_userland_test.sh). No hwloc: what a user without it
#                        sees is tested there too.
#   bookworm-arm64       an arm64 userland (python3, venv, a shell) for qemu-user: the aarch64
#                        wheel's jobs run in it under emulation (tests/packaging/aarch64_test.sh).
#
#   packaging/make-sysroot.sh NAME
# Idempotent: a root whose stamp (the mmdebstrap command that made it) matches is left alone;
# one made by another command is made again. Prints the root's path.
set -euo pipefail
name=${1:?usage: make-sysroot.sh NAME}
mirror=${CPPRUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
dir=${CPPRUN_SYSROOTS:-/opt/cpprun/sysroots}/$name
case $name in
  bookworm-arm64-deps)
    args=(--variant=extract --arch=arm64 --include=libssl-dev,libhwloc-dev bookworm) ;;
  bullseye-torch)
    args=(--variant=minbase --include=python3-venv,python3-torch,procps bullseye) ;;
  bookworm-arm64)
    args=(--variant=extract --arch=arm64
          --include=dash,bash,coreutils,python3,python3-venv,python3-pip-whl,python3-setuptools-whl
          bookworm) ;;
  *) echo "make-sysroot: unknown root '$name'" >&2; exit 2 ;;
esac
stamp="mmdebstrap ${args[*]}"
if [ -f "$dir/.cpprun-sysroot" ] && [ "$(cat "$dir/.cpprun-sysroot")" = "$stamp" ]; then
  echo "$dir"
  exit 0
fi
started=$(date +%s)
rm -rf "$dir" "$dir.partial"
mkdir -p "$(dirname "$dir")"
mmdebstrap --quiet "${args[@]}" "$dir.partial" "$mirror" >&2
echo "$stamp" > "$dir.partial/.cpprun-sysroot"
mv "$dir.partial" "$dir"
echo "make-sysroot: $name made in $(( $(date +%s) - started )) s, $(du -sh "$dir" | cut -f1)" >&2
echo "$dir"
