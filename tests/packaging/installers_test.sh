#!/usr/bin/env bash
# The other ways users install Python tools, with the wheel and the sdist, offline:
#   uv venv + uv pip install   the wheel into a venv over Debian's python3
#   uv tool install            the wheel into uv's own tool venv, bin/ entries linked into a bin dir
#   uvx --from WHEEL           the wheel in an ephemeral venv in uv's cache
#   pipx install               the wheel, with pipx's pip backend and with its uv backend
#   the sdist                  built (python -m build --sdist), unpacked, pip-installed into a
#                              fresh venv: CMake and the host's g++ compile it (not zig)
# Each: bin/cpprun --version, python -m cpprun --version (the environment's python), and a
# two-worker job of tests/packaging/data/installers_worker.py from a clean environment (env -i,
# PATH=/usr/local/bin:/usr/bin:/bin: no venv, no bin dir on PATH, no PYTHON_EXEC): every rank must
# have run the python of the environment cpprun was installed into. Then the uninstaller, after
# which the bin/ entries are gone.
#
#   installers_test.sh SOURCE_DIR WHEEL_DIR BUILD_DIR
# WHEEL_DIR holds cpprun-VERSION-py3-none-manylinux_*_ARCH.whl for this machine's ARCH
# (packaging/build-wheel.sh). uv, pipx and build come from the wheel-tools venv
# (${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}, packaging/setup.sh --wheel-tools); without
# them, or without the wheel, the test fails. Every installer runs under env -i with HOME, the XDG
# folders, uv's cache and tool folders and pipx's home in a scratch folder, removed at exit: nothing
# outside it (and BUILD_DIR/sdist-*) is written.
#
# The sdist's CMake build, BUILD_DIR/sdist-build, is kept between runs, and so is the folder the
# sdist is unpacked into, BUILD_DIR/sdist-src: scikit-build-core clears a build folder whose source
# folder changed (pip unpacks a .tar.gz into a new temporary folder each time), and the sdist's
# files carry one fixed mtime, so a file is copied there only when its content changed. The fresh
# venv has no scikit-build-core and there is no index to get it from (--no-build-isolation, like
# packaging/build-wheel.sh): a .pth file in the venv's site-packages appends the wheel-tools venv's
# site-packages to its sys.path, as if the user had pip-installed scikit-build-core there.
set -euo pipefail
[ $# = 3 ] || { echo "usage: installers_test.sh SOURCE_DIR WHEEL_DIR BUILD_DIR" >&2; exit 2; }
src=$(cd "$1" && pwd)
[ -d "$2" ] || { echo "installers_test: FAILED: no wheel folder $2 (packaging/build-wheel.sh builds the wheels; packaging/setup.sh --wheel-tools installs its tools)" >&2; exit 1; }
wheel_dir=$(cd "$2" && pwd)
build=$(cd "$3" && pwd)
tools=${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
base_python=/usr/bin/python3
worker=$src/tests/packaging/data/installers_worker.py
fail() { echo "installers_test: FAILED: $*" >&2; exit 1; }
started=$(date +%s)
last=$started
step() {
  local now
  now=$(date +%s)
  echo "installers_test: $* ($(( now - last )) s, $(( now - started )) s in all)"
  last=$now
}

# What the test needs; it fails, never skips, without it.
setup="packaging/setup.sh --wheel-tools installs it into $tools"
[ -x "$base_python" ] || fail "$base_python is missing (Debian's python3; packaging/setup.sh)"
for exe in uv uvx pipx python; do
  [ -x "$tools/bin/$exe" ] || fail "$tools/bin/$exe is missing ($setup)"
done
timeout 30 "$tools/bin/python" -c 'import build, scikit_build_core' 2> /dev/null ||
  fail "$tools lacks build or scikit-build-core ($setup)"
version=$(sed -n 's/^project(cpprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no version in $src/CMakeLists.txt"
arch=$(uname -m)
shopt -s nullglob
wheels=("$wheel_dir"/cpprun-"$version"-py3-none-manylinux_*_"$arch".whl)
shopt -u nullglob
[ ${#wheels[@]} = 1 ] || fail "want one cpprun-$version-py3-none-manylinux_*_$arch.whl in $wheel_dir, found ${#wheels[@]} (packaging/build-wheel.sh builds it; packaging/setup.sh --wheel-tools installs its tools)"
whl=${wheels[0]}
step "uv $(timeout 30 "$tools/bin/uv" --version | cut -d' ' -f2), $(timeout 30 "$tools/bin/pipx" --version | sed 's/^/pipx /'), wheel $(basename "$whl")"

# Canonical (no symbolic links on the way): cpprun finds its environment from /proc/self/exe.
scratch=$(realpath "$(mktemp -d)")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/home" "$scratch/tmp"
system_path=/usr/local/bin:/usr/bin:/bin
# The installers' environment: only what is set here, everything they write in scratch, no index.
tool_env=(env -i "PATH=$system_path" "HOME=$scratch/home" "TMPDIR=$scratch/tmp" "LANG=C.UTF-8"
  "XDG_CONFIG_HOME=$scratch/home/.config" "XDG_CACHE_HOME=$scratch/home/.cache"
  "XDG_DATA_HOME=$scratch/home/.local/share" "XDG_STATE_HOME=$scratch/home/.local/state"
  "XDG_BIN_HOME=$scratch/home/.local/bin"
  "UV_CACHE_DIR=$scratch/uv-cache" "UV_TOOL_DIR=$scratch/uv-tools" "UV_TOOL_BIN_DIR=$scratch/uv-bin"
  "UV_PYTHON_INSTALL_DIR=$scratch/uv-python" "UV_PYTHON_DOWNLOADS=never" "UV_NO_CONFIG=1"
  "UV_OFFLINE=1" "UV_NO_PROGRESS=1"
  "PIPX_HOME=$scratch/pipx" "PIPX_BIN_DIR=$scratch/pipx-bin" "PIPX_MAN_DIR=$scratch/pipx-man"
  "PIPX_DEFAULT_PYTHON=$base_python" "PIPX_DISABLE_SHARED_LIBS_AUTO_UPGRADE=1"
  "PIP_NO_INDEX=1" "PIP_CONFIG_FILE=/dev/null" "PIP_DISABLE_PIP_VERSION_CHECK=1"
  "PIP_NO_INPUT=1")
# A user's shell where nothing of cpprun's environments is on PATH.
clean=(env -i "HOME=$scratch/home" "PATH=$system_path" "TMPDIR=$scratch/tmp" "LANG=C.UTF-8")

# run LOG LIMIT CMD...: CMD in the installers' environment, its output in scratch/LOG.log (shown
# when it fails).
run() {
  local log=$scratch/$1.log limit=$2
  shift 2
  local rc=0
  "${tool_env[@]}" timeout "$limit" "$@" > "$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { cat "$log" >&2; fail "$* (exit $rc, output above)"; }
}

# job NAME CPPRUN PREFIX [how]: a two-worker job run by CPPRUN (a path, or a command line) in the
# clean environment; both ranks must have run PREFIX/bin/python3 (sys.prefix = PREFIX).
job() {
  local name=$1 cpprun=$2 prefix=$3 out=$scratch/out-$1 r
  mkdir "$out"
  # shellcheck disable=SC2086  # CPPRUN may be a command line (uvx --from ...)
  "${clean[@]}" timeout 120 $cpprun --nproc-per-node=2 --max-restarts=0 "$worker" "$out" \
    > "$scratch/job-$name.log" 2>&1 ||
    { cat "$scratch/job-$name.log" >&2; fail "$name: the two-worker job failed"; }
  for r in 0 1; do
    [ -f "$out/rank-$r.json" ] || { cat "$scratch/job-$name.log" >&2; fail "$name: rank $r wrote nothing"; }
    local got
    got=$("$base_python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["executable"], d["prefix"])' \
      "$out/rank-$r.json")
    echo "installers_test: $name: rank $r ran ${got% *} (sys.prefix ${got#* })"
    [ "$got" = "$prefix/bin/python3 $prefix" ] ||
      { cat "$scratch/job-$name.log" >&2; fail "$name: rank $r ran '${got% *}' (sys.prefix ${got#* }), not $prefix/bin/python3"; }
  done
}

# checks NAME BIN_DIR ENV: the entries in BIN_DIR, --version directly and through ENV's python,
# cpprun-store, and the job; ENV is the environment the wheel went into.
checks() {
  local name=$1 bin=$2 env=$3 exe
  for exe in cpprun cpprun-store; do
    [ -x "$bin/$exe" ] || fail "$name: no $bin/$exe"
    [ "$(readlink -f "$bin/$exe")" = "$env/bin/$exe" ] ||
      fail "$name: $bin/$exe leads to $(readlink -f "$bin/$exe"), not $env/bin/$exe"
  done
  [ -f "$env/pyvenv.cfg" ] || fail "$name: $env has no pyvenv.cfg"
  [ "$("${clean[@]}" timeout 30 "$bin/cpprun" --version)" = "cpprun $version" ] ||
    fail "$name: $bin/cpprun --version"
  [ "$("${clean[@]}" timeout 30 "$env/bin/python" -m cpprun --version)" = "cpprun $version" ] ||
    fail "$name: $env/bin/python -m cpprun --version"
  "${clean[@]}" timeout 30 "$bin/cpprun-store" --help > /dev/null 2>&1 || fail "$name: $bin/cpprun-store --help"
  job "$name" "$bin/cpprun" "$env"
  job "$name-python-m" "$env/bin/python -m cpprun" "$env"
}

gone() {  # gone NAME PATH...: after the uninstall
  local name=$1 p
  shift
  for p in "$@"; do
    if [ -e "$p" ] || [ -L "$p" ]; then fail "$name: $p is still there after the uninstall"; fi
  done
}

# 1. uv venv + uv pip install; uv pip uninstall leaves the venv as it was.
venv=$scratch/uv-venv
run uv-venv 60 "$tools/bin/uv" venv --python "$base_python" "$venv"
# uv's lock of the venv, .lock, appears with the first uv pip command and stays: not cpprun's.
listing() { (cd "$venv" && find . \( -name __pycache__ -o -path ./.lock \) -prune -o -print | sort); }
listing > "$scratch/uv-venv-before.txt"
run uv-pip-install 120 "$tools/bin/uv" pip install --python "$venv/bin/python" --offline --no-index "$whl"
step "uv venv + uv pip install"
checks "uv-pip" "$venv/bin" "$venv"
step "uv pip: --version, python -m cpprun, the jobs"
run uv-pip-uninstall 60 "$tools/bin/uv" pip uninstall --python "$venv/bin/python" cpprun
gone "uv-pip" "$venv/bin/cpprun" "$venv/bin/cpprun-store"
listing > "$scratch/uv-venv-after.txt"
diff "$scratch/uv-venv-before.txt" "$scratch/uv-venv-after.txt" >&2 ||
  fail "uv pip uninstall left the venv changed (above)"
step "uv pip uninstall: the venv as it was"

# 2. uv tool install: the tool venv UV_TOOL_DIR/cpprun, symbolic links in UV_TOOL_BIN_DIR.
run uv-tool-install 120 "$tools/bin/uv" tool install --offline --no-index --python "$base_python" "$whl"
step "uv tool install"
checks "uv-tool" "$scratch/uv-bin" "$scratch/uv-tools/cpprun"
step "uv tool: --version, python -m cpprun, the jobs"
run uv-tool-uninstall 60 "$tools/bin/uv" tool uninstall cpprun
gone "uv-tool" "$scratch/uv-bin/cpprun" "$scratch/uv-bin/cpprun-store" "$scratch/uv-tools/cpprun"
step "uv tool uninstall"

# 3. uvx: an ephemeral venv in uv's cache, named by a hash; the ranks must run its python.
out=$scratch/out-uvx
mkdir "$out"
"${tool_env[@]}" timeout 120 "$tools/bin/uvx" --offline --no-index --python "$base_python" \
  --from "$whl" cpprun --nproc-per-node=2 --max-restarts=0 "$worker" "$out" > "$scratch/job-uvx.log" 2>&1 ||
  { cat "$scratch/job-uvx.log" >&2; fail "uvx: the two-worker job failed"; }
for r in 0 1; do
  [ -f "$out/rank-$r.json" ] || { cat "$scratch/job-uvx.log" >&2; fail "uvx: rank $r wrote nothing"; }
  read -r exe prefix < <("$base_python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["executable"], d["prefix"])' "$out/rank-$r.json")
  echo "installers_test: uvx: rank $r ran $exe"
  case $prefix in "$scratch/uv-cache/"*) ;; *) fail "uvx: rank $r ran $exe, not a python of uv's cache" ;; esac
  if [ "$exe" != "$prefix/bin/python3" ] || [ ! -f "$prefix/pyvenv.cfg" ] || [ ! -x "$prefix/bin/cpprun" ]; then
    fail "uvx: rank $r ran $exe, not the python of the venv uvx ran cpprun from"
  fi
done
step "uvx --from WHEEL cpprun: the job"

# 4. pipx, with each backend: the venv PIPX_HOME/venvs/cpprun, symbolic links in PIPX_BIN_DIR.
for backend in pip uv; do
  run "pipx-$backend-install" 180 "$tools/bin/pipx" install --backend "$backend" \
    --python "$base_python" --pip-args=--no-index "$whl"
  grep -q "^uv = " "$scratch/pipx/venvs/cpprun/pyvenv.cfg" && made=uv || made=pip
  [ "$made" = "$backend" ] || fail "pipx --backend $backend: the venv was made by $made"
  step "pipx install --backend $backend"
  checks "pipx-$backend" "$scratch/pipx-bin" "$scratch/pipx/venvs/cpprun"
  step "pipx ($backend backend): --version, python -m cpprun, the jobs"
  run "pipx-$backend-uninstall" 60 "$tools/bin/pipx" uninstall cpprun
  gone "pipx-$backend" "$scratch/pipx-bin/cpprun" "$scratch/pipx-bin/cpprun-store" "$scratch/pipx/venvs/cpprun"
  step "pipx uninstall ($backend backend)"
done

# 5. The sdist: built from SOURCE_DIR, complete without the repository's tests, docs, examples.
run sdist 300 "$tools/bin/python" -m build --sdist --no-isolation --outdir "$scratch/sdist" "$src"
sdist=$scratch/sdist/cpprun-$version.tar.gz
[ -f "$sdist" ] || fail "python -m build made no $sdist"
tar -tzf "$sdist" | cut -d/ -f2 | sort -u | grep . > "$scratch/sdist-top.txt"
for top in tests docs examples .ci .git; do
  ! grep -qx "$top" "$scratch/sdist-top.txt" || fail "the sdist holds $top/"
done
! grep -q '^build' "$scratch/sdist-top.txt" || fail "the sdist holds a build folder"
for f in PKG-INFO pyproject.toml CMakeLists.txt README.md python/cpprun/__init__.py; do
  tar -tzf "$sdist" "cpprun-$version/$f" > /dev/null 2>&1 || fail "the sdist lacks $f"
done
step "sdist $(basename "$sdist"): $(stat -c %s "$sdist") bytes, $(tar -tzf "$sdist" | grep -vc '/$') files; top level: $(tr '\n' ' ' < "$scratch/sdist-top.txt")"

# Unpacked, then copied into the kept folder file by file where the content changed (new mtime).
mkdir "$scratch/unpacked"
timeout 60 tar -xzf "$sdist" -C "$scratch/unpacked"
new=$scratch/unpacked/cpprun-$version
kept=$build/sdist-src/cpprun-$version
mkdir -p "$kept"
changed=0
while IFS= read -r -d '' f; do
  if ! cmp -s "$new/$f" "$kept/$f"; then
    mkdir -p "$(dirname "$kept/$f")"
    rm -f "$kept/$f"
    cp "$new/$f" "$kept/$f"
    changed=$((changed + 1))
  fi
done < <(cd "$new" && find . -type f -printf '%P\0')
while IFS= read -r -d '' f; do
  [ -e "$new/$f" ] || { rm -f "$kept/$f"; changed=$((changed + 1)); }
done < <(cd "$kept" && find . -type f -printf '%P\0')
step "unpacked into $kept ($changed files new, changed or removed)"

svenv=$scratch/sdist-venv
run sdist-venv 120 "$base_python" -m venv --system-site-packages "$svenv"
site=$("$svenv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
tools_site=$("$tools/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$tools_site" > "$site/cpprun-test-build-backend.pth"
"$svenv/bin/python" -c 'import scikit_build_core' || fail "scikit-build-core does not import in $svenv"
# The host's compiler: no toolchain file, CC/CXX unset (env -i).
run sdist-install 1500 env "CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$svenv/bin/pip" install -v --no-build-isolation --no-index --no-deps \
  --config-settings=build-dir="$build/sdist-build" "$kept"
rm "$site/cpprun-test-build-backend.pth"
compiled=$(grep -c 'Building CXX object' "$scratch/sdist-install.log" || true)
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/sdist-build/CMakeCache.txt")
case $compiler in *zig*) fail "the sdist was compiled by $compiler, not the host's compiler" ;; esac
comment=$(timeout 30 readelf -p .comment "$svenv/bin/cpprun" | grep -o 'GCC: .*' | head -n 1)
[ -n "$comment" ] || fail "$svenv/bin/cpprun was not compiled by GCC (readelf -p .comment)"
step "pip install of the unpacked sdist: $compiled C++ files compiled by $compiler ($comment)"
checks "sdist" "$svenv/bin" "$svenv"
step "sdist: --version, python -m cpprun, the jobs"
echo "installers_test: passed ($(( $(date +%s) - started )) s)"
