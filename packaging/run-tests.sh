#!/usr/bin/env bash
# Installs what is missing, builds cpprun and runs every test. This is the README's test
# command and what CI runs.
#
# With CI=true it also: treats warnings as errors (always on here), checks formatting, compiles
# the annotated libraries with clang's thread-safety analysis (no tests), runs the
# whole suite once more under ASan+UBSan and once under TSan, and fuzzes the wire codec for a bounded time
# (CPPRUN_FUZZ_SECONDS, default 60).
set -euo pipefail
cd "$(dirname "$0")/.."

packaging/setup.sh

echo "== build (preset ci: RelWithDebInfo, -Werror)"
cmake --preset ci
cmake --build --preset ci

echo "== tests"
ctest --preset ci -j2

if [ "${CI:-}" = "true" ]; then
  echo "== clang-format check"
  git ls-files '*.h' '*.cc' | xargs clang-format --dry-run --Werror

  echo "== lock annotations (preset thread-safety: clang -Werror=thread-safety, compile only)"
  cmake --preset thread-safety
  cmake --build --preset thread-safety

  echo "== fuzz the wire codec (${CPPRUN_FUZZ_SECONDS:-60} s)"
  cmake --preset fuzz
  cmake --build --preset fuzz
  corpus=$(mktemp -d)
  trap 'rm -rf "$corpus"' EXIT
  /usr/bin/python3 tests/fuzz/make_seed_corpus.py tests/rendezvous/data/torch-1.13.json \
    tests/rendezvous/data/torch-2.1.json tests/rendezvous/data/torch-2.15.json "$corpus"
  build-fuzz/tests/fuzz/wire_fuzz -max_total_time="${CPPRUN_FUZZ_SECONDS:-60}" \
    -print_final_stats=1 "$corpus" 2>&1 | tail -n 12

  echo "== fuzz the store records the agents read (${CPPRUN_RECORD_FUZZ_SECONDS:-30} s)"
  records=$(mktemp -d)
  trap 'rm -rf "$corpus" "$records"' EXIT
  /usr/bin/python3 tests/fuzz/make_record_corpus.py "$records"
  build-fuzz/tests/fuzz/record_fuzz -max_total_time="${CPPRUN_RECORD_FUZZ_SECONDS:-30}" \
    -print_final_stats=1 "$records" 2>&1 | tail -n 6

  echo "== tests under ASan + UBSan"
  cmake --preset asan
  cmake --build --preset asan
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -j2

  echo "== tests under ThreadSanitizer"
  cmake --preset tsan
  cmake --build --preset tsan
  TSAN_OPTIONS=halt_on_error=1 ctest --preset tsan -j2
fi
