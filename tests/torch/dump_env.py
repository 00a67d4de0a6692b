"""Worker for the torchrun-vs-cpprun differential test (tests/e2e/torchrun_diff_test.cc).

Usage: dump_env.py OUT_DIR [--fail-rank R]

Writes this worker's whole environment, as one JSON object, to
OUT_DIR/rank<RANK>_attempt<TORCHELASTIC_RESTART_COUNT>.json (written to a temporary name first and
renamed, so a reader never sees half a file). With --fail-rank R, the worker whose RANK is R then
exits 1 in attempt 0 (TORCHELASTIC_RESTART_COUNT=0), so a launcher with --max-restarts=1 runs an
attempt 1. Uses only the standard library, so it runs under any interpreter.
"""

import json
import os
import sys


def main():
    out_dir = sys.argv[1]
    fail_rank = None
    if len(sys.argv) > 3 and sys.argv[2] == "--fail-rank":
        fail_rank = sys.argv[3]
    env = dict(os.environ)
    rank = env.get("RANK", "none")
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "none")
    path = os.path.join(out_dir, "rank%s_attempt%s.json" % (rank, attempt))
    with open(path + ".tmp", "w") as f:
        json.dump(env, f, sort_keys=True)
    os.rename(path + ".tmp", path)
    if rank == fail_rank and attempt == "0":
        sys.exit(1)


if __name__ == "__main__":
    main()
