#!/usr/bin/env bash
# Every Catch2 test of the given binaries must be runnable by name through ctest:
# catch_discover_tests splits a name at ';', a '\' in a filter escapes the next character, and
# Catch2 reads a filter that starts with '-' as an option. ctest would then run a filter that
# matches nothing (a pass, were it not for --warn NoTests). Fails naming each such test.
set -euo pipefail
bad=0
for binary in "$@"; do
  while IFS= read -r name; do
    case "$name" in
      *";"* | -* | *\\*)
        echo "$(basename "$binary"): '$name' cannot be run by ctest (a ';' or a leading '-')"
        bad=1
        ;;
    esac
  done < <("$binary" --list-test-names-only)
done
exit "$bad"
