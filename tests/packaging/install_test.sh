#!/usr/bin/env bash
# What a user installs, tested as installed: `cmake --install` to a scratch prefix, or the .deb
# CPack builds unpacked into a scratch root (dpkg-deb -x, nothing touches the system). Either
# way the tree must hold the binaries, the man page, bash completion, the modulefile, the
# examples and the shipped data, and a two-worker job must run from it alone.
#
#   install_test.sh install BUILD_DIR     cmake --install BUILD_DIR --prefix SCRATCH
#   install_test.sh deb BUILD_DIR         cpack in BUILD_DIR, then dpkg-deb -x
set -euo pipefail
mode=$1
build=$(cd "$2" && pwd)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "install_test ($mode): $*" >&2; exit 1; }

case $mode in
  install)
    cmake --install "$build" --prefix "$scratch/prefix" > "$scratch/install.log"
    prefix=$scratch/prefix
    ;;
  deb)
    (cd "$scratch" && cpack --config "$build/CPackConfig.cmake" -G DEB -B "$scratch/pkg" \
      > "$scratch/cpack.log" 2>&1) || { cat "$scratch/cpack.log" >&2; fail "cpack failed"; }
    deb=$(ls "$scratch"/pkg/cpprun_"$version"_*.deb) || fail "no cpprun_${version}_*.deb"
    dpkg-deb --info "$deb" > "$scratch/info"
    grep -q "^ Package: cpprun$" "$scratch/info" || fail "package name"
    grep -q "^ Version: $version$" "$scratch/info" || fail "package version"
    # dpkg-shlibdeps computed the dependencies from the binaries' libraries.
    for lib in libc6 libopenblas libgloo; do
      grep "^ Depends:" "$scratch/info" | grep "$lib" > /dev/null || fail "Depends lacks $lib: $(grep Depends "$scratch/info")"
    done
    # hwloc is loaded when --numa-binding needs it (launcher/hwloc_library.h): recommended, not
    # required.
    grep "^ Recommends:" "$scratch/info" | grep libhwloc15 > /dev/null ||
      fail "Recommends lacks libhwloc15: $(grep Recommends "$scratch/info")"
    if grep "^ Depends:" "$scratch/info" | grep libhwloc > /dev/null; then
      fail "Depends names hwloc, which cpprun loads only for --numa-binding: $(grep Depends "$scratch/info")"
    fi
    # Workers start without Boost.Process since issue 16: no Boost library is linked.
    if grep "^ Depends:" "$scratch/info" | grep libboost > /dev/null; then
      fail "Depends names a Boost library: $(grep Depends "$scratch/info")"
    fi
    dpkg-deb -x "$deb" "$scratch/root"
    prefix=$scratch/root/usr
    ;;
  *) fail "unknown mode $mode" ;;
esac

for f in bin/cpprun bin/cpprun-store bin/cpprun-mnist share/man/man1/cpprun.1 \
  share/bash-completion/completions/cpprun "share/modulefiles/cpprun/$version" \
  share/cpprun/mnist/train-images-idx3-ubyte.gz share/cpprun/mnist/t10k-labels-idx1-ubyte.gz \
  share/doc/cpprun/README.md share/doc/cpprun/examples/slurm/cpprun.sbatch \
  share/doc/cpprun/examples/slurm/cpprun-preemptible.sbatch \
  share/doc/cpprun/examples/mpi/cpprun-mpirun.sh share/doc/cpprun/examples/containers/cpprun.def \
  share/doc/cpprun/examples/python/mnist_ddp.py; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done

[ "$("$prefix/bin/cpprun" --version)" = "cpprun $version" ] || fail "cpprun --version"
# The man page renders and is the --help text: every option is in it.
MANWIDTH=200 man -l "$prefix/share/man/man1/cpprun.1" > "$scratch/man.txt" 2>/dev/null ||
  fail "man -l cannot render the page"
grep -q "torchrun-style launcher" "$scratch/man.txt" || fail "man page lacks its NAME line"
for opt in --nproc-per-node --rdzv-backend --signals-to-handle --check --dry-run; do
  grep -q -- "$opt" "$scratch/man.txt" || fail "man page lacks $opt"
done

# bash completion: options from --help, values of the options with fixed sets.
complete_words() {
  PATH="$prefix/bin:$PATH" bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
    _cpprun; printf "%s\n" "${COMPREPLY[@]}"' _ "$prefix/share/bash-completion/completions/cpprun" "$@"
}
complete_words cpprun --nproc-per | grep -qx -- "--nproc-per-node" || fail "completion of --nproc-per"
[ "$(complete_words cpprun --rdzv-backend "" | sort | tr '\n' ' ')" = "c10d etcd etcd-v2 static " ] ||
  fail "completion of --rdzv-backend values"

# The modulefile (Environment Modules' modulecmd; Lmod reads the same Tcl file): relocatable.
modulecmd=$(command -v modulecmd || true)
[ -n "$modulecmd" ] || modulecmd=/usr/lib/x86_64-linux-gnu/modulecmd.tcl
[ -x "$modulecmd" ] || fail "no modulecmd (environment-modules is installed by setup.sh)"
loaded=$(env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c '
  eval "$("$1" bash use "$2")"; eval "$("$1" bash load cpprun)"
  echo "$(command -v cpprun) $CPPRUN_ROOT"' _ "$modulecmd" "$prefix/share/modulefiles")
[ "$loaded" = "$prefix/bin/cpprun $prefix" ] || fail "module load cpprun gave '$loaded'"

# A two-worker job from the tree alone: the installed trainer on the installed data.
out=$("$prefix/bin/cpprun" --nproc-per-node=2 "$prefix/bin/cpprun-mnist" --epochs 1 --max-steps 5 \
  --threads 1 --log-interval 1 2>&1) || { echo "$out" >&2; fail "the two-worker job failed"; }
# (here-strings, not `echo | grep -q`: with pipefail, grep -q's early exit fails the pipe)
grep -q "2 rank(s).*data $prefix/bin/../share/cpprun/mnist" <<< "$out" ||
  { echo "$out" >&2; fail "the job did not use the installed data"; }
grep -q "all 2 workers succeeded" <<< "$out" || { echo "$out" >&2; fail "no success line"; }
echo "install_test ($mode): ok: $prefix"
