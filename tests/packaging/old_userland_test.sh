#!/usr/bin/env bash
# The x86_64 manylinux_2_28 wheel in an older userland, for real: Debian 11 bullseye (glibc 2.31,
# Python 3.9, Debian's torch 1.7.1), the root packaging/make-sysroot.sh bullseye-torch makes under
# ${CPPRUN_SYSROOTS:-/opt/cpprun/sysroots}/bullseye-torch. That root is only read: the test runs
# in its own mount and pid namespaces (unshare), over an overlayfs whose upper layer is a tmpfs, with
# /dev, a fresh /proc, a read-only /sys and the wheel bound in, then chroot. Every mount and every
# process it started dies with the namespace; the scratch folder is removed at exit.
#
#   old_userland_test.sh SOURCE_DIR WHEEL_DIR
# WHEEL_DIR holds cpprun-VERSION-py3-none-manylinux_2_*_x86_64.whl (packaging/build-wheel.sh).
#
# In the root:
#   1. a venv made by the root's python3 (--system-site-packages: it sees torch 1.7), the wheel
#      pip-installed into it offline;
#   2. bin/cpprun --version and python -m cpprun --version;
#   3. a two-worker DDP job (gloo, CPU, env://) of examples/python/ddp_train.py, unchanged, run by
#      the venv's bin/cpprun with a PATH without the venv: both ranks train, agree, and ran the
#      venv's python. Two things belong to torch 1.7, not to cpprun, and are dealt with here:
#      - its env:// always makes rank 0 create the TCPStore server at MASTER_PORT (it reads no
#        TORCHELASTIC_USE_AGENT_STORE), which the agent's store holds, and its client numbers the
#        requests without COMPARE_SET (ADD is 2); so the job runs with --worker-hosts-store, as
#        trainers written for torch.distributed.launch do;
#      - Debian's 1.7.1 on Python 3.9 aborts or hangs at interpreter exit once autograd ran
#        (pytorch/pytorch#38230, #50893), so the script runs under data/exit_hard.py, which ends
#        the process with os._exit after it.
#   4. no hwloc there: --numa-binding=node warns that libhwloc.so.15 does not load, naming
#      libhwloc15, and starts the worker unbound (exit 0, documented); with --strict-numa-binding
#      it stops with exit 3 and no worker runs; --check reports it and passes.
# Every command has a bound; each step prints its time. Missing prerequisites fail the test (it
# never skips) and say what to run.
set -euo pipefail
me=old_userland_test
fail() { echo "$me: FAILED: $*" >&2; exit 1; }
# shellcheck source=tests/packaging/root_overlay.sh
. "$(dirname "${BASH_SOURCE[0]}")/root_overlay.sh"
now_ms() { date +%s%3N; }
self=$(readlink -f "${BASH_SOURCE[0]}")

if [ "${1:-}" != --in-namespace ]; then
  # ---- On the host: check what the test needs, then run the rest in fresh namespaces. ----
  [ $# = 2 ] || { echo "usage: $me.sh SOURCE_DIR WHEEL_DIR" >&2; exit 2; }
  src=$(cd "$1" && pwd)
  [ -d "$2" ] || fail "no wheel folder $2; run packaging/build-wheel.sh $2 BUILD_DIR"
  wheel_dir=$(cd "$2" && pwd)
  root=${CPPRUN_SYSROOTS:-/opt/cpprun/sysroots}/bullseye-torch
  make_root="run (as root, once per machine): $src/packaging/make-sysroot.sh bullseye-torch"

  [ "$(uname -m)" = x86_64 ] || fail "this machine is $(uname -m); the test runs the x86_64 wheel natively"
  if ! [ -x "$root/usr/bin/python3" ] || ! grep -q bullseye "$root/.cpprun-sysroot" 2> /dev/null; then
    fail "no Debian 11 root at $root (or not one make-sysroot.sh made); $make_root"
  fi
  [ -d "$root/usr/lib/python3/dist-packages/torch" ] || fail "$root has no torch; $make_root"
  version=$(sed -n 's/^project(cpprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
  shopt -s nullglob
  wheels=("$wheel_dir"/cpprun-"$version"-py3-none-manylinux_2_*_x86_64.whl)
  shopt -u nullglob
  [ ${#wheels[@]} = 1 ] || fail "want one cpprun-$version-py3-none-manylinux_2_*_x86_64.whl in" \
    "$wheel_dir, found ${#wheels[@]}; run packaging/build-wheel.sh $wheel_dir BUILD_DIR"
  root_overlay_preflight

  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  started=$(now_ms)
  echo "$me: root $root ($(du -sh --apparent-size "$root" 2> /dev/null | cut -f1 || true))," \
    "wheel $(basename "${wheels[0]}")"
  # --kill-child: if this script or its timeout goes, the namespace's pid 1 gets SIGKILL and
  # every process in it goes too.
  set +e
  timeout -k 10 300 unshare --mount --pid --fork --kill-child --propagation private \
    bash "$self" --in-namespace "$src" "${wheels[0]}" "$root" "$scratch" "$version"
  rc=$?
  set -e
  [ "$rc" = 0 ] || fail "exit $rc after $(( $(now_ms) - started )) ms (above)"
  echo "$me: passed in $(( $(now_ms) - started )) ms"
  exit 0
fi

# ---- In the namespaces (this bash is pid 1): build the view of the root, run the steps. ----
src=$2 whl=$3 root=$4 scratch=$5 version=$6
logs=$scratch/logs
mkdir "$logs"
t0=$(now_ms)
last=$t0
step() {
  local t
  t=$(now_ms)
  echo "$me: $* ($(( t - last )) ms; $(( t - t0 )) ms in all)"
  last=$t
}
show() { echo "---- $1" >&2; cat "$1" >&2; echo "----" >&2; }

m=$scratch/root
root_overlay_mount "$root" "$scratch/layer" "$m"
mkdir "$m/wheel"
touch "$m/wheel/$(basename "$whl")"
mount --bind -o ro "$whl" "$m/wheel/$(basename "$whl")"
mkdir "$m/job" "$m/out"
cp "$src/examples/python/ddp_train.py" "$src/tests/packaging/data/exit_hard.py" "$m/job/"
wheel=/wheel/$(basename "$whl")
venv=/venv

# in_root SECONDS COMMAND...: COMMAND in the root, bounded, with the environment of a user whose
# PATH does not hold the venv.
in_root() {
  local bound=$1
  shift
  timeout -k 5 "$bound" chroot "$m" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/bin:/usr/bin:/bin GLOO_SOCKET_IFNAME=lo "$@"
}
glibc=$(in_root 10 getconf GNU_LIBC_VERSION)
py=$(in_root 10 python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
torch=$(in_root 60 python3 -c 'import torch; print(torch.__version__)')
step "root mounted: $glibc, Python $py, torch $torch"
if [ "$glibc" != "glibc 2.31" ] || [ "$py" != 3.9 ] || [ "${torch#1.7.}" = "$torch" ]; then
  fail "the root is not Debian 11's (glibc 2.31, Python 3.9, torch 1.7): remake it with" \
    "packaging/make-sysroot.sh bullseye-torch"
fi

# 1. A venv of the root's python3 that sees its torch; the wheel installed offline.
in_root 60 python3 -m venv --system-site-packages "$venv" > "$logs/venv.log" 2>&1 ||
  { show "$logs/venv.log"; fail "python3 -m venv failed in the root"; }
in_root 120 "$venv/bin/pip" install --no-index --no-deps --disable-pip-version-check "$wheel" \
  > "$logs/install.log" 2>&1 || { show "$logs/install.log"; fail "pip install of the wheel failed"; }
for exe in cpprun cpprun-store; do
  [ -x "$m$venv/bin/$exe" ] || fail "pip install did not put $exe into the venv's bin/"
done
step "1. venv made by the root's Python $py, wheel installed offline"

# 2. The binary runs on glibc 2.31; python -m cpprun finds it.
out=$(in_root 30 "$venv/bin/cpprun" --version 2>&1) || fail "bin/cpprun --version: $out"
[ "$out" = "cpprun $version" ] || fail "bin/cpprun --version printed '$out'"
out=$(in_root 30 "$venv/bin/python" -m cpprun --version 2>&1) || fail "python -m cpprun --version: $out"
[ "$out" = "cpprun $version" ] || fail "python -m cpprun --version printed '$out'"
out=$(in_root 30 "$venv/bin/cpprun-store" --help 2>&1) || fail "bin/cpprun-store --help: $out"
step "2. cpprun --version, python -m cpprun --version, cpprun-store --help"

# 3. Two-worker DDP job, unchanged script, from the venv's bin/ with no PYTHON_EXEC.
set +e
in_root 180 "$venv/bin/cpprun" --worker-hosts-store --nproc-per-node=2 --max-restarts=0 \
  /job/exit_hard.py /job/ddp_train.py --out /out --steps 5 > "$logs/job.log" 2>&1
rc=$?
set -e
[ "$rc" = 0 ] || { show "$logs/job.log"; fail "the DDP job exited $rc"; }
for r in 0 1; do
  [ -f "$m/out/result-$r.json" ] || { show "$logs/job.log"; fail "rank $r wrote no result"; }
  grep -q "^\[default$r\]:rank $r: all_reduce=3.0 loss=" "$logs/job.log" ||
    { show "$logs/job.log"; fail "rank $r did not report its training"; }
done
check=$(in_root 30 python3 - /out/result-0.json /out/result-1.json << 'EOF'
import json, math, sys
r = [json.load(open(p)) for p in sys.argv[1:]]
bad = []
for i, x in enumerate(r):
    if x["rank"] != i or x["world_size"] != 2 or x["all_reduce"] != 3.0:
        bad.append("rank %d: %r" % (i, x))
    if not math.isfinite(x["loss"]):
        bad.append("rank %d: loss %r" % (i, x["loss"]))
if r[0]["param_checksum"] != r[1]["param_checksum"]:
    bad.append("the ranks' parameters differ: %r" % [x["param_checksum"] for x in r])
for x in r:
    print("rank %d ran %s, loss %.4f, checksum %r" % (x["rank"], x["executable"], x["loss"],
                                                       x["param_checksum"]))
if bad:
    print("BAD " + "; ".join(bad))
EOF
) || fail "reading the results failed: $check"
while read -r line; do echo "$me:   $line"; done <<< "$check"
case $check in *BAD*) show "$logs/job.log"; fail "wrong results (above)" ;; esac
for r in 0 1; do
  echo "$check" | grep -qx "rank $r ran $venv/bin/python3, .*" ||
    fail "rank $r did not run the venv's $venv/bin/python3"
done
step "3. DDP job (gloo, 2 ranks, 5 steps, worker-hosted store): both ran the venv's python"

# 4. No hwloc in this root.
msg_ok() { grep -q "libhwloc.so.15 does not load" "$1" && grep -q "libhwloc15" "$1"; }
rm -f "$m/out/worker-ran"
set +e
in_root 30 "$venv/bin/cpprun" --numa-binding=node --nproc-per-node=1 --no-python \
  touch /out/worker-ran > "$logs/numa.log" 2>&1
rc=$?
set -e
[ "$rc" = 0 ] || { show "$logs/numa.log"; fail "--numa-binding=node without hwloc exited $rc, not 0"; }
if ! msg_ok "$logs/numa.log" || ! grep -q "starting unbound" "$logs/numa.log"; then
  show "$logs/numa.log"
  fail "--numa-binding=node without hwloc: no warning naming libhwloc15"
fi
[ -f "$m/out/worker-ran" ] || { show "$logs/numa.log"; fail "--numa-binding=node: the worker did not run"; }
rm -f "$m/out/worker-ran"
set +e
in_root 30 "$venv/bin/cpprun" --numa-binding=node --strict-numa-binding --nproc-per-node=1 \
  --no-python touch /out/worker-ran > "$logs/strict.log" 2>&1
rc=$?
set -e
[ "$rc" = 3 ] || { show "$logs/strict.log"; fail "--strict-numa-binding without hwloc exited $rc, not 3"; }
msg_ok "$logs/strict.log" || { show "$logs/strict.log"; fail "--strict-numa-binding: no error naming libhwloc15"; }
[ ! -e "$m/out/worker-ran" ] || { show "$logs/strict.log"; fail "--strict-numa-binding: a worker ran"; }
! grep -q "started 1 workers" "$logs/strict.log" || { show "$logs/strict.log"; fail "--strict-numa-binding started a worker"; }
in_root 30 "$venv/bin/cpprun" --check > "$logs/check.log" 2>&1 ||
  { show "$logs/check.log"; fail "cpprun --check failed without hwloc"; }
grep "GPU locality" "$logs/check.log" > "$logs/locality.txt" || true
msg_ok "$logs/locality.txt" || { show "$logs/check.log"; fail "cpprun --check does not say hwloc does not load"; }
while read -r line; do echo "$me:   strict: $line"; done < "$logs/strict.log"
step "4. no hwloc: --numa-binding warns and starts unbound (exit 0); --strict-numa-binding exits 3, no worker; --check passes"
