"""Worker for tests/e2e/file_timer_test.cc: torch's real FileTimerClient under a launcher.

Usage: file_timer_worker.py MODE [HANG_RANK]

Every rank configures torch.distributed.elastic.timer with a FileTimerClient on
$TORCHELASTIC_TIMER_FILE (default signal: SIGKILL), prints "TIMER_FILE <path>" and runs three
short steps inside `expires(after=2, scope="quick_step")`, each released in time. Then:

  hang       rank HANG_RANK prints "ARMED_AT <epoch s>" inside `expires(after=1,
             scope="train_step")` and sleeps forever; the others print DONE and exit 0.
  hang-once  as hang in the first attempt (TORCHELASTIC_RESTART_COUNT 0), as release after.
  release    every rank waits until its released scopes would have expired, and 1 s more (a
             late kill would show), then prints DONE and exits 0.
"""

import os
import sys
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires


def main():
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    path = os.environ["TORCHELASTIC_TIMER_FILE"]
    print("TIMER_FILE %s" % path, flush=True)
    configure(FileTimerClient(path))
    started = time.time()
    for _ in range(3):
        with expires(after=2, scope="quick_step"):
            time.sleep(0.05)
    if mode == "hang-once":
        mode = "hang" if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" else "release"
    if mode == "hang" and rank == int(sys.argv[2]):
        with expires(after=1, scope="train_step"):
            print("ARMED_AT %.3f" % time.time(), flush=True)
            while True:
                time.sleep(1)
    if mode == "release":
        time.sleep(max(0.0, started + 3.0 - time.time()))
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
