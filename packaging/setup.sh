#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of cpprun from Debian 12's own packages.
# Idempotent and non-interactive: packages already present are left alone, and apt is not
# consulted at all when nothing is missing. Nothing is downloaded from anywhere but Debian.
#
# Usage (as root, or with sudo available):  packaging/setup.sh [--build-only]
#   --build-only: what building and running cpprun needs, not the tests' peers (PyTorch, Slurm,
#                 Open MPI, datasets); the container definition uses it.
set -euo pipefail

build_only=0
case "${1:-}" in
  --build-only) build_only=1 ;;
  "") ;;
  *) echo "setup.sh: unknown argument '$1' (usage: setup.sh [--build-only])" >&2; exit 2 ;;
esac

build_packages=(
  build-essential cmake g++ pkg-config
  libboost-dev libboost-system-dev libboost-filesystem-dev nlohmann-json3-dev catch2 zlib1g-dev
  libgloo-dev libopenblas-dev help2man
)
packages=(
  # toolchain
  build-essential cmake g++ clang clang-format libclang-rt-14-dev pkg-config git
  # libraries
  libboost-dev libboost-system-dev libboost-filesystem-dev nlohmann-json3-dev catch2 zlib1g-dev
  # the bundled MNIST trainer's CPU data parallelism
  libgloo-dev libopenblas-dev
  # tests and benchmarks: the real PyTorch 1.13 (interop peer), process tools
  python3 python3-torch procps iproute2
  # the trainer's benchmark and sweep: Fashion-MNIST (60k/10k) and plots
  dataset-fashion-mnist python3-matplotlib
  # multi-node tests: real Open MPI and Slurm (slurmctld + slurmd + munge started by the tests)
  openmpi-bin slurmctld slurmd slurm-client munge
  # packaging: the man page from --help, the .deb's dependencies (dpkg-shlibdeps), and the
  # modulefile's test (Environment Modules; Lmod reads the same Tcl modulefile)
  help2man dpkg-dev environment-modules
  # --stall-timeout's native stacks (gdb in batch mode); its tests need it
  gdb
)

if [ "$build_only" = 1 ]; then packages=("${build_packages[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
echo "setup: installing ${missing[*]}"
$sudo apt-get -o DPkg::Lock::Timeout=600 update -q
$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
