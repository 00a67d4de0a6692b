"""Progress reports for cpprun's --stall-timeout, for any Python trainer.

Copy this file next to your script (or put examples/python on PYTHONPATH), then:

    from cpprun_progress import Progress

    progress = Progress()           # under cpprun: also registers faulthandler on SIGUSR1
    for step, batch in enumerate(loader):
        ...                         # forward, backward, optimizer step
        progress.step(step)         # one pwrite(2) of 21 bytes

Outside cpprun (no CPPRUN_PROGRESS_FILE) every call does nothing. With --stall-timeout S, a
rank whose progress has not moved for S seconds is reported stalled: cpprun sends it SIGUSR1,
faulthandler writes every thread's Python stack to $CPPRUN_STACK_FILE, gdb adds the native
stacks, and the attempt fails (restart or end). Pass dump_stacks_on_sigusr1=False if your
trainer uses SIGUSR1 itself (e.g. as Slurm's pre-emption warning); cpprun then sends no SIGUSR1.
"""
import faulthandler
import os
import signal


class Progress:
    def __init__(self, dump_stacks_on_sigusr1=True):
        path = os.environ.get("CPPRUN_PROGRESS_FILE")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644) if path else None
        self._stacks = None
        stacks = os.environ.get("CPPRUN_STACK_FILE")
        if stacks and dump_stacks_on_sigusr1:
            # Register first, then give the file its name: cpprun sends SIGUSR1 only once the
            # file exists, so the signal can never find the default action (termination).
            self._stacks = open(stacks + ".tmp", "a")
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
            os.rename(stacks + ".tmp", stacks)
        self.count = 0

    def step(self, counter=None):
        """Reports progress: `counter` (e.g. the global step), or one more than last time."""
        if self._fd is None:
            return
        self.count = self.count + 1 if counter is None else int(counter)
        os.pwrite(self._fd, b"%020d\n" % self.count, 0)
