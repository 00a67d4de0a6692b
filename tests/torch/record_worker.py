"""Worker for the error-file checks of tests/e2e/torchrun_diff_test.cc.

Usage: record_worker.py FAIL_RANK

Its main() is decorated with torch.distributed.elastic.multiprocessing.errors.record, so the
worker whose RANK is FAIL_RANK raises ValueError("record_worker: rank R failed on purpose") from
fail_here() and @record writes torch's error file to $TORCHELASTIC_ERROR_FILE (message, Python
traceback, timestamp) before the exception ends the process with exit code 1. The other ranks
exit 0 at once. Needs torch (any version that has the errors module: 1.9 and later).
"""

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


def fail_here(rank):
    raise ValueError("record_worker: rank %s failed on purpose" % rank)


@record
def main():
    rank = os.environ["RANK"]
    if rank == sys.argv[1]:
        fail_here(rank)


if __name__ == "__main__":
    main()
