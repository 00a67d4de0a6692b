#!/usr/bin/env bash
# The Python wheel, tested as a user uses it: the x86_64 manylinux_2_28 wheel packaging/release.sh
# built (the release fixture: tests/packaging/release_test.sh), pip-installed offline into a
# fresh venv over Debian's python3 (--system-site-packages: it imports Debian's torch 1.13), and
# a two-worker DDP job (gloo, CPU) with the venv's bin/cpprun, with no PYTHON_EXEC and a PATH
# without the venv: every worker must run the venv's python. `python -m cpprun --version/--help`
# work; `pip uninstall` leaves the venv as it was.
#
#   wheel_test.sh SOURCE_DIR WHEEL_DIR
# Everything lives in a scratch folder removed at exit. Every step has a bound.
set -euo pipefail
src=$(cd "$1" && pwd)
wheels=$(cd "$2" && pwd)
base_python=/usr/bin/python3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "wheel_test: $*" >&2; exit 1; }
step() { echo "wheel_test: $* ($(( $(date +%s) - started )) s)"; }
started=$(date +%s)

version=$(sed -n 's/^project(cpprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")

# 1. The wheel the release built.
whl=$wheels/cpprun-$version-py3-none-manylinux_2_28_x86_64.whl
[ -f "$whl" ] || fail "no $(basename "$whl") in $wheels (packaging/release.sh makes it)"
step "$(basename "$whl"), $(stat -c %s "$whl") bytes; it holds:"
"$base_python" -m zipfile -l "$whl" | sed 's/^/  /'

# 2. A fresh venv that sees Debian's torch; install offline.
timeout 120 "$base_python" -m venv --system-site-packages "$scratch/venv"
venv=$scratch/venv
listing() { (cd "$venv" && find . -path ./__pycache__ -prune -o -print | sort); }
listing > "$scratch/before.txt"
timeout 120 "$venv/bin/pip" install --no-index --no-deps --disable-pip-version-check "$whl" \
  > "$scratch/install.log" 2>&1 || { cat "$scratch/install.log" >&2; fail "pip install failed"; }
for exe in cpprun cpprun-store; do
  [ -x "$venv/bin/$exe" ] || fail "pip install did not put $exe into the venv's bin/"
done
step "installed into $venv"

# The environment of a user whose PATH does not hold the venv: only the system's bin folders.
clean=(env -i "HOME=$scratch" "PATH=/usr/local/bin:/usr/bin:/bin" "TMPDIR=$scratch" "GLOO_SOCKET_IFNAME=lo")

# 3. The binary from an installed wheel finds its libraries and runs; python -m cpprun too.
[ "$("${clean[@]}" timeout 30 "$venv/bin/cpprun" --version)" = "cpprun $version" ] ||
  fail "bin/cpprun --version"
[ "$("${clean[@]}" timeout 30 "$venv/bin/python" -m cpprun --version)" = "cpprun $version" ] ||
  fail "python -m cpprun --version"
"${clean[@]}" timeout 30 "$venv/bin/python" -m cpprun --help > "$scratch/help.txt" ||
  fail "python -m cpprun --help exited $?"
grep -q -- "--nproc-per-node" "$scratch/help.txt" || fail "python -m cpprun --help lacks --nproc-per-node"
"${clean[@]}" timeout 30 "$venv/bin/cpprun-store" --help > /dev/null 2>&1 ||
  fail "bin/cpprun-store --help"
# Exit codes pass through the exec: a bad flag is cpprun's exit 2.
set +e
"${clean[@]}" timeout 30 "$venv/bin/python" -m cpprun --no-such-flag x.py > /dev/null 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "python -m cpprun --no-such-flag exited $rc, not 2"
step "--version, --help and exit codes, directly and through python -m cpprun"

# 4. A two-worker DDP job from the venv's bin/: no PYTHON_EXEC, PATH without the venv.
mkdir "$scratch/out"
"${clean[@]}" timeout 180 "$venv/bin/cpprun" --nproc-per-node=2 --max-restarts=0 \
  "$src/examples/python/ddp_train.py" --out "$scratch/out" --steps 5 > "$scratch/job.log" 2>&1 ||
  { cat "$scratch/job.log" >&2; fail "the DDP job failed"; }
for r in 0 1; do
  [ -f "$scratch/out/result-$r.json" ] || { cat "$scratch/job.log" >&2; fail "rank $r wrote no result"; }
  exe=$("$base_python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["executable"])' \
    "$scratch/out/result-$r.json")
  echo "wheel_test: rank $r ran sys.executable=$exe"
  [ "$exe" = "$venv/bin/python3" ] || fail "rank $r ran $exe, not the venv's $venv/bin/python3"
done
step "DDP job: both ranks ran the venv's python"

# 5. Uninstall leaves the venv's files as before the install.
timeout 120 "$venv/bin/pip" uninstall -y --disable-pip-version-check cpprun > "$scratch/uninstall.log" 2>&1 ||
  { cat "$scratch/uninstall.log" >&2; fail "pip uninstall failed"; }
listing > "$scratch/after.txt"
diff "$scratch/before.txt" "$scratch/after.txt" >&2 || fail "pip uninstall left files behind (above)"
step "pip uninstall left the venv as it was ($(wc -l < "$scratch/after.txt") entries)"
echo "wheel_test: passed"
