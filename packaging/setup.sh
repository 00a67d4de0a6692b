#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of cpprun: Debian 12's own packages, and
# the tests' PyTorch 2.x peer from PyPI into a virtual environment outside the clone,
# ${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}, at the version packaging/torch2-requirements.txt pins
# (so every clone and CI on one machine share it; the download happens once per machine).
# Idempotent and non-interactive: packages already present are left alone, apt is not consulted
# when nothing is missing, and pip is not run when the venv already holds the pinned torch.
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
  libboost-dev nlohmann-json3-dev catch2 zlib1g-dev
  libgloo-dev libopenblas-dev help2man libssl-dev libhwloc-dev
)
packages=(
  # toolchain
  build-essential cmake g++ clang clang-format libclang-rt-14-dev pkg-config git
  # libraries
  libboost-dev nlohmann-json3-dev catch2 zlib1g-dev
  # the bundled MNIST trainer's CPU data parallelism
  libgloo-dev libopenblas-dev
  # --numa-binding: the node's CPUs, caches, NUMA nodes and PCI devices (and XML topologies)
  libhwloc-dev
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
  # the torch 2.x venv (below) is made with Debian's python3
  python3-venv
  # etcd rendezvous: TLS by OpenSSL; its tests start real etcd clusters (etcdctl reads status)
  libssl-dev etcd-server etcd-client
  # the etcd tests make their CA and certificates with the openssl CLI
  openssl
)

if [ "$build_only" = 1 ]; then packages=("${build_packages[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
else
  export DEBIAN_FRONTEND=noninteractive
  echo "setup: installing ${missing[*]}"
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -q
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
  echo "setup: Debian packages done"
fi

if [ "$build_only" = 1 ]; then exit 0; fi

# PyTorch 2.x from PyPI (Debian ships only 1.13). The venv uses Debian's python3 (3.11).
requirements="$(cd "$(dirname "$0")" && pwd)/torch2-requirements.txt"
venv="${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}"
pinned=$(sed -n 's/^torch==//p' "$requirements")
# Every name==version line of the requirements, not only torch: a venv made before a pin was
# added (python-etcd for torchrun's etcd backends) gets it on the next set-up. Prints the pins the
# venv lacks; nothing when it holds them all.
lacking=$("$venv/bin/python" - "$requirements" 2>/dev/null <<'PY' || echo "(no venv)"
import importlib.metadata as m, re, sys
lacking = []
for line in open(sys.argv[1]):
    pin = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
    if not pin:
        continue
    try:
        have = m.version(pin[1])
    except m.PackageNotFoundError:
        have = None
    if have != pin[2]:
        lacking.append(f"{pin[1]}=={pin[2]}")
print(" ".join(lacking))
PY
)
if [ -z "$lacking" ]; then
  echo "setup: torch $pinned and the other pins of $(basename "$requirements") present in $venv"
  exit 0
fi
echo "setup: installing $lacking from PyPI into $venv (torch: once per machine, ~5.4 GiB)"
started=$(date +%s)
$sudo mkdir -p "$(dirname "$venv")"
$sudo /usr/bin/python3 -m venv "$venv"
$sudo "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
echo "setup: $lacking installed in $(( $(date +%s) - started )) s, $(du -sh "$venv" | cut -f1)"
