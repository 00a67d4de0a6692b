"""A Python worker that reports progress through examples/python/cpprun_progress.py, then stalls
in hang_in_collective() when RANK equals argv[2] (argv[1]: the examples/python directory)."""
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
from cpprun_progress import Progress  # noqa: E402


def hang_in_collective():
    while True:
        time.sleep(3600)


progress = Progress()
for step in range(3):
    progress.step(step + 1)
if os.environ.get("RANK") == sys.argv[2]:
    hang_in_collective()
