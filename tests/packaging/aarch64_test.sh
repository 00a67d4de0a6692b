#!/usr/bin/env bash
# The aarch64 wheel (Grace Hopper's), tested on emulated aarch64 as a user there uses it: in an
# arm64 Debian 12 userland (packaging/make-sysroot.sh bookworm-arm64) run by qemu-user through
# binfmt_misc, the root's own python3 makes a venv, `pip install --no-index --no-deps` puts the
# wheel into it, and the venv's bin/cpprun, with a PATH without the venv, runs:
#   --version (directly and as python -m cpprun), --dry-run (the workers' command is the venv's
#   python: /proc/self/exe under qemu), a two-worker `--no-python sh -c` job (RANK, WORLD_SIZE,
#   LOCAL_RANK, MASTER_PORT reach both workers), a two-worker job of
#   tests/packaging/data/tcpstore_worker.py, a torch-free TCPStore client (its bytes checked
#   against torch 1.13's captured ones) that exchanges a key, a counter and two barriers through
#   the store the agent serves, in both the torch 1.13 and the torch >= 2.2 dialect; both workers
#   must run the venv's python on aarch64; and a job whose rank 1 exits 3 (rank 0 and its child
#   are stopped, exit 1, rank 1 the root cause). No process of a job may outlive it.
#
#   aarch64_test.sh SOURCE_DIR WHEEL_DIR      (as root: mounts, chroot, binfmt_misc)
# WHEEL_DIR holds cpprun-<version>-py3-none-manylinux_2_*_aarch64.whl (packaging/build-wheel.sh).
#
# The root (${CPPRUN_SYSROOTS:-/opt/cpprun/sysroots}/bookworm-arm64) is only read: everything
# runs in `unshare --mount --pid`, chrooted into an overlayfs over it whose upper layer is a tmpfs
# of that mount namespace, with a fresh /proc, the host's /dev and a read-only /sys; pid 1 there
# is a shell that reaps orphans, and every process the test starts dies with it (an interrupted
# test SIGKILLs unshare, whose child then gets SIGKILL). binfmt_misc is global: an enabled handler
# for aarch64 ELF already registered (any name) is used as it is (its interpreter copied into the
# overlay when it lacks F); otherwise binfmt_misc is mounted if it is not, a handler named
# cpprun-test-aarch64 is registered (qemu's magic and mask, F so that it works inside the chroot),
# and at exit exactly that entry is removed (and binfmt_misc unmounted if this test mounted it).
# ctest: RESOURCE_LOCK binfmt. Missing qemu, binfmt_misc, root or wheel fails the test, saying
# what to run. Every step has a bound (the namespace as a whole 300 s) and prints its time.
#
# What qemu-user (7.2) lacks, and what it means here: prctl(PR_SET_CHILD_SUBREAPER) fails with
# EINVAL (cpprun warns "cannot become a child subreaper"), so a worker's descendant that leaves
# its process group outlives the job under emulation (not on real aarch64); and it runs
# clone(CLONE_VM | CLONE_VFORK) as a plain fork, so an exec failure of a worker shows as exit code
# 127 instead of cpprun's "cannot run" error. The jobs below do neither.
set -euo pipefail
me=aarch64_test
fail() { echo "$me: FAILED: $*" >&2; exit 1; }
# shellcheck source=tests/packaging/root_overlay.sh
. "$(dirname "${BASH_SOURCE[0]}")/root_overlay.sh"
now() { echo "${EPOCHREALTIME/./}"; }  # microseconds
seconds() { local us=$(( $1 )); printf '%d.%d' $(( us / 1000000 )) $(( us % 1000000 / 100000 )); }
step_started=$(now)
test_started=${AARCH64_TEST_STARTED:-$step_started}  # the outer run's start, in the namespace
step() {
  local t
  t=$(now)
  echo "$me: $* ($(seconds "t - step_started") s; $(seconds "t - test_started") s in all)"
  step_started=$t
}

venv=/opt/venv                            # paths inside the emulated root
clean_env=(HOME=/root PATH=/usr/local/bin:/usr/bin:/bin TMPDIR=/tmp LANG=C.UTF-8)

# ---------------------------------------------------------------------------------------------
# Inside the namespaces (pid 1 of a fresh pid namespace, own mount namespace; host binaries).
# ---------------------------------------------------------------------------------------------
in_namespace() {
  local src=$1 whl=$2 root=$3 scratch=$4 version=$5 copy_interpreter=$6
  local layer=$scratch/layer out=$scratch/out
  local merged=$scratch/root
  mkdir "$out"
  root_overlay_mount "$root" "$layer" "$merged"
  mkdir -p "$merged/wheels" "$merged/data" "$merged/out"
  mount --bind "$(dirname "$whl")" "$merged/wheels"
  mount -o remount,bind,ro "$merged/wheels"
  mount --bind "$src/tests/packaging/data" "$merged/data"
  mount -o remount,bind,ro "$merged/data"
  mount --bind "$out" "$merged/out"
  if [ -n "$copy_interpreter" ]; then
    # A handler without F opens its interpreter at exec time, in the chroot: put it there.
    mkdir -p "$merged$(dirname "$copy_interpreter")"
    cp "$(readlink -f "$copy_interpreter")" "$merged$copy_interpreter"
  fi
  # emulated BOUND_S COMMAND...: COMMAND in the root, with a clean environment.
  emulated() {
    local bound=$1
    shift
    timeout -k 5 "$bound" env -i "${clean_env[@]}" "$chroot_bin" "$merged" "$@"
  }
  # No process of a job outlives it: only pid 1, the timeout and this shell are alive in the
  # namespace. (Zombies are dead: cpprun's sentinel, forked twice, is pid 1's to reap.)
  only_us_left() {
    local p stat left=()
    for p in "$merged"/proc/[0-9]*; do
      p=${p##*/}
      case $p in 1 | "$$" | "$PPID") continue ;; esac
      stat=$(cat "$merged/proc/$p/stat" 2> /dev/null) || continue  # gone meanwhile
      stat=${stat#*) }
      [ "${stat%% *}" = Z ] ||
        left+=("$p ($(tr '\0' ' ' < "$merged/proc/$p/cmdline" 2> /dev/null))")
    done
    [ ${#left[@]} = 0 ] || fail "processes left after $1: ${left[*]}"
  }
  step "set up: overlay (tmpfs upper) over $root; /proc, /dev, /sys (read-only), the wheel, data"

  # 1. A venv made by the root's python3, the wheel pip-installed into it offline.
  local python
  python=$(emulated 60 /usr/bin/python3 -c \
    'import platform, sys; print(platform.machine(), sys.version.split()[0])' 2>&1) ||
    fail "the root's python3 does not run under emulation: $python"
  [ "${python%% *}" = aarch64 ] || fail "the root's python3 says: $python"
  emulated 150 /usr/bin/python3 -m venv "$venv" > "$scratch/venv.log" 2>&1 ||
    { cat "$scratch/venv.log" >&2; fail "python3 -m venv failed"; }
  step "python3 -m venv $venv (python ${python#* } on ${python%% *}, emulated)"
  emulated 120 "$venv/bin/pip" install --no-index --no-deps --disable-pip-version-check \
    "/wheels/$(basename "$whl")" > "$scratch/install.log" 2>&1 ||
    { cat "$scratch/install.log" >&2; fail "pip install of the wheel failed"; }
  local exe
  for exe in cpprun cpprun-store; do
    [ -x "$merged$venv/bin/$exe" ] || fail "pip install did not put $exe into the venv's bin/"
    # ELF e_machine (bytes 18-19): 0xb7 is EM_AARCH64.
    [ "$(od -An -tx1 -j18 -N2 "$merged$venv/bin/$exe" | tr -d ' ')" = b700 ] ||
      fail "the venv's $exe is not an aarch64 ELF executable"
  done
  step "pip install --no-index --no-deps $(basename "$whl")"

  # 2. --version, directly and through python -m cpprun; cpprun-store runs.
  local v
  v=$(emulated 30 "$venv/bin/cpprun" --version 2>&1) || fail "bin/cpprun --version exited $?: $v"
  [ "$v" = "cpprun $version" ] || fail "bin/cpprun --version printed '$v', not 'cpprun $version'"
  v=$(emulated 30 "$venv/bin/python" -m cpprun --version 2>&1) ||
    fail "python -m cpprun --version exited $?: $v"
  [ "$v" = "cpprun $version" ] || fail "python -m cpprun --version printed '$v'"
  emulated 30 "$venv/bin/cpprun-store" --help > "$scratch/store-help.txt" 2>&1 ||
    { cat "$scratch/store-help.txt" >&2; fail "bin/cpprun-store --help"; }
  step "cpprun --version, python -m cpprun --version: $v; cpprun-store --help"

  # 3. --dry-run: the plan, and the workers' interpreter is the venv's python.
  local worker=(/data/tcpstore_worker.py --out /out --timeout 60)
  local plan=$scratch/dry-run.txt r want
  emulated 30 "$venv/bin/cpprun" --dry-run --nproc-per-node=2 "${worker[@]}" > "$plan" 2>&1 ||
    { cat "$plan" >&2; fail "cpprun --dry-run failed"; }
  for r in 0 1; do
    want="  worker local_rank $r rank $r: $venv/bin/python3 -u ${worker[*]}"
    grep -qxF "$want" "$plan" || { cat "$plan" >&2; fail "--dry-run: no line '$want'"; }
  done
  grep -qE '^  workers +2 here, ranks 0\.\.1 of world size 2$' "$plan" ||
    { cat "$plan" >&2; fail "--dry-run: no 'workers 2 here, ranks 0..1 of world size 2'"; }
  only_us_left "--dry-run"
  step "cpprun --dry-run: 2 workers, each '$venv/bin/python3 -u ${worker[*]}'"

  # 4. A two-worker job of a shell command.
  local log=$scratch/sh-job.log line port ports=()
  # shellcheck disable=SC2016  # expanded by the workers' sh
  emulated 60 "$venv/bin/cpprun" --nproc-per-node=2 --max-restarts=0 --no-python sh -c \
    'echo "env RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK" \
       "MASTER_PORT=$MASTER_PORT MACHINE=$(uname -m)"' > "$log" 2>&1 ||
    { cat "$log" >&2; fail "the sh -c job exited $?"; }
  for r in 0 1; do
    line=$(grep -E "^\[default$r\]:env " "$log") ||
      { cat "$log" >&2; fail "sh -c job: no line of worker $r"; }
    want="^\\[default$r\\]:env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_PORT=([0-9]+)"
    want+=" MACHINE=aarch64$"
    [[ $line =~ $want ]] || fail "sh -c job, worker $r printed: $line"
    port=${BASH_REMATCH[1]}
    [ "$port" -gt 0 ] || fail "sh -c job, worker $r: MASTER_PORT=$port"
    ports+=("$port")
    echo "  $line"
  done
  [ "${ports[0]}" = "${ports[1]}" ] || fail "sh -c job: MASTER_PORT ${ports[0]} and ${ports[1]}"
  grep -E '^cpprun .* (WARN|ERROR) ' "$log" | sed 's/^/  agent said: /' || true
  only_us_left "the sh -c job"
  step "two-worker --no-python sh -c job: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_PORT reached both"

  # 5. A two-worker Python job through the agent's store, with the venv's python.
  log=$scratch/py-job.log
  emulated 120 "$venv/bin/cpprun" --nproc-per-node=2 --max-restarts=0 "${worker[@]}" \
    > "$log" 2>&1 ||
    { cat "$log" >&2; fail "the Python job exited $?"; }
  local f counts=() masters=()
  field() { sed -n "s/^$1=//p" "$f"; }
  for r in 0 1; do
    f=$out/result-$r.txt
    [ -f "$f" ] || { cat "$log" >&2; fail "rank $r wrote no result"; }
    expect() {
      [ "$(field "$1")" = "$2" ] ||
        { cat "$f" >&2; fail "rank $r: $1 is '$(field "$1")', not '$2'"; }
    }
    expect rank "$r"
    expect world_size 2
    expect local_rank "$r"
    expect use_agent_store True
    expect executable "$venv/bin/python3"
    expect prefix "$venv"
    expect base_prefix /usr
    expect machine aarch64
    expect arrived 2
    expect arrived_text 2
    expect v2_ping ok
    expect barrier 00
    [[ $(field greeting) =~ ^hello\ from\ rank\ 0\ \(aarch64,\ pid\ [0-9]+\)$ ]] ||
      fail "rank $r got the greeting '$(field greeting)'"
    [ "$r" = 0 ] || expect greeting "$(f=$out/result-0.txt; field greeting)"
    expect v2_greeting "$(field greeting)"
    counts+=("$(field init_count)")
    masters+=("$(field master)")
  done
  [ "$(printf '%s\n' "${counts[@]}" | sort | tr '\n' ' ')" = "1 2 " ] ||
    fail "ADD init/ 1 answered ${counts[*]}, not 1 and 2"
  [ "${masters[0]}" = "${masters[1]}" ] || fail "the workers' stores: ${masters[*]}"
  grep '^\[default[01]\]:tcpstore_worker' "$log" | sed 's/^/  /'
  only_us_left "the Python job"
  step "two-worker Python job: a key, counters and barriers through the store at ${masters[0]}," \
    "both ranks ran $venv/bin/python3 on aarch64"

  # 6. A failing worker: rank 1 exits 3; rank 0 (a shell waiting on a child that would run for
  # 5 minutes) is stopped by the agent through its process group, grandchild included; the job
  # exits 1 and the report names rank 1's exit code 3 as the root cause.
  log=$scratch/fail-job.log
  local rc=0 cause
  # shellcheck disable=SC2016  # expanded by the workers' sh
  emulated 60 "$venv/bin/cpprun" --nproc-per-node=2 --max-restarts=0 --no-python sh -c \
    'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 300 & wait' > "$log" 2>&1 || rc=$?
  [ "$rc" = 1 ] || { cat "$log" >&2; fail "the job with a failing worker exited $rc, not 1"; }
  cause=$(grep -A6 '^Root Cause' "$log" | tr '\n' '|')
  want='\|  rank +: 1 \(local_rank: 1\)\|  exitcode +: 3 \(pid: '
  [[ $cause =~ $want ]] ||
    { cat "$log" >&2; fail "the report does not name rank 1's exit code 3 as the root cause"; }
  only_us_left "the job with a failing worker"
  step "a worker exiting 3: the other one and its child stopped, exit 1, rank 1 the root cause"
}

if [ "${1:-}" = --in-namespace ]; then
  shift
  chroot_bin=$1
  shift
  in_namespace "$@"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# On the host: what is needed, binfmt_misc, then the namespaces.
# ---------------------------------------------------------------------------------------------
[ $# = 2 ] || { echo "usage: $me.sh SOURCE_DIR WHEEL_DIR" >&2; exit 2; }
self=$(readlink -f "${BASH_SOURCE[0]}")
src=$(cd "$1" && pwd)
wheel_dir=$(cd "$2" 2> /dev/null && pwd) ||
  fail "no wheel folder $2: build the wheels with packaging/build-wheel.sh $2 BUILD_DIR"
root=${CPPRUN_SYSROOTS:-/opt/cpprun/sysroots}/bookworm-arm64
version=$(sed -n 's/^project(cpprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project version in $src/CMakeLists.txt"

root_overlay_preflight
for tool in umount mountpoint od; do
  command -v "$tool" > /dev/null || fail "no $tool on PATH (util-linux, coreutils)"
done
chroot_bin=$(command -v chroot)
qemu=$(command -v qemu-aarch64-static) ||
  fail "no qemu-aarch64-static: apt-get install qemu-user-static (packaging/setup.sh --wheel-tools)"
{ [ -f "$root/.cpprun-sysroot" ] && [ -x "$root/usr/bin/python3" ] && [ -e "$root/bin/sh" ]; } ||
  fail "no arm64 userland at $root: run packaging/make-sysroot.sh bookworm-arm64 as root" \
    "(packaging/setup.sh --wheel-tools does)"
shopt -s nullglob
wheels=("$wheel_dir"/cpprun-"$version"-py3-none-manylinux_2_*_aarch64.whl)
shopt -u nullglob
[ ${#wheels[@]} = 1 ] ||
  fail "want one cpprun-$version-py3-none-manylinux_2_*_aarch64.whl in $wheel_dir, found" \
    "${#wheels[@]}: run packaging/build-wheel.sh $wheel_dir BUILD_DIR"
whl=${wheels[0]}

binfmt=/proc/sys/fs/binfmt_misc
entry=cpprun-test-aarch64
aarch64_magic=7f454c460201010000000000000000000200b700
mounted_binfmt=0
registered=0
scratch=
ns_pid=
cleanup() {
  local rc=$?
  if [ -n "$ns_pid" ] && kill -0 "$ns_pid" 2> /dev/null; then
    # Interrupted. unshare --fork blocks SIGTERM and SIGINT (they are its child's to handle):
    # SIGKILL it, and its child, pid 1 of the namespace, gets SIGKILL (--kill-child): every
    # process in the namespace dies with it.
    kill -KILL "$ns_pid"
    wait "$ns_pid" 2> /dev/null || true
  fi
  if [ "$registered" = 1 ] && [ -e "$binfmt/$entry" ]; then
    echo -1 > "$binfmt/$entry" || { echo "$me: could not remove $binfmt/$entry" >&2; rc=1; }
  fi
  if [ "$mounted_binfmt" = 1 ] && mountpoint -q "$binfmt"; then
    umount "$binfmt" || { echo "$me: could not unmount $binfmt" >&2; rc=1; }
  fi
  [ -z "$scratch" ] || rm -rf "$scratch"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if ! mountpoint -q "$binfmt"; then
  mounted_binfmt=1  # before: an interrupted mount is still undone
  timeout 30 mount -t binfmt_misc binfmt_misc "$binfmt" ||
    fail "cannot mount binfmt_misc on $binfmt (CONFIG_BINFMT_MISC; a container needs its host's)"
fi
[ "$(cat "$binfmt/status")" = enabled ] ||
  fail "binfmt_misc is disabled on this machine (echo 1 > $binfmt/status enables every handler)"
handler='' interpreter='' flags=''
for e in "$binfmt"/*; do
  case ${e##*/} in register | status) continue ;; esac
  if grep -qx enabled "$e" 2> /dev/null && grep -qx "magic $aarch64_magic" "$e" &&
     grep -qx "offset 0" "$e"; then
    handler=${e##*/}
    interpreter=$(sed -n 's/^interpreter //p' "$e")
    flags=$(sed -n 's/^flags: //p' "$e")
    break
  fi
done
copy_interpreter=
if [ -n "$handler" ]; then
  case $flags in *F*) ;; *) copy_interpreter=$interpreter ;; esac
  note="already registered as $handler ($interpreter, flags ${flags:-none}), used as it is"
  [ "$handler" != "$entry" ] ||
    note+="; left by a killed run of this test? remove it with: echo -1 > $binfmt/$entry"
else
  # qemu's aarch64 magic and mask (Debian's binfmt.d/qemu-aarch64.conf). Its *-binfmt-P link
  # tells qemu that the kernel preserved argv[0] (flag P); F: the kernel opens the interpreter
  # now, so it needs not exist inside the chroot.
  preserve=/usr/libexec/qemu-binfmt/aarch64-binfmt-P
  if [ -x "$preserve" ]; then interpreter=$preserve flags=OPF; else interpreter=$qemu flags=OF; fi
  registered=1  # before: an interrupted registration is still undone
  magic='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  printf '%s' ":$entry:M::$magic:$mask:$interpreter:$flags" \
    > "$binfmt/register" || fail "could not register an aarch64 handler in $binfmt/register"
  note="registered $binfmt/$entry ($interpreter, flags $flags), removed at exit"
fi
step "binfmt_misc$([ "$mounted_binfmt" = 0 ] || echo ' (mounted by this test)'): $note"

scratch=$(mktemp -d)
export AARCH64_TEST_STARTED=$test_started
# In the background, so that a signal to this shell runs its trap at once (not after the job).
# Pid 1 of the namespace is a shell (it reaps what is re-parented to it) that runs the steps
# under one bound; when it ends, so does every process in there.
# shellcheck disable=SC2016  # expanded by that shell
unshare --mount --propagation private --pid --fork --kill-child \
  bash -c 'timeout -s KILL 300 bash "$@"; exit $?' pid1 "$self" --in-namespace \
  "$chroot_bin" "$src" "$whl" "$root" "$scratch" "$version" "$copy_interpreter" &
ns_pid=$!
rc=0
wait "$ns_pid" || rc=$?
ns_pid=
[ "$rc" = 0 ] || fail "the emulated run exited $rc (above)"
step_started=$test_started
step "passed: the aarch64 wheel in a venv of an emulated arm64 Debian 12"
