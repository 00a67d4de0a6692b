"""Hosts torch's own TCPStore server, for tests that point cpprun's client at it.

Run by tests/rendezvous/torch_interop_test.cc with Debian's /usr/bin/python3 (torch 1.13) and by
tests/rendezvous/torch2_interop_test.cc with the pinned torch 2.x:

    python tests/torch/torch_store_server.py [--host H] [--port P] [--backend libuv|legacy]

Creates TCPStore(host, port, world_size=None, is_master=True) (port 0: the kernel picks one);
torch 2.x takes --backend: libuv (its default server) or legacy (use_libuv=False, the
poll-based TCPStoreBackend); torch 1.13 has only its one server and refuses the flag. Prints
"PORT <n>", then "BACKEND libuv|legacy" on torch 2.x, and serves until SIGTERM/SIGINT, until
its parent process exits, or after --max-seconds (a safety net: a test harness that dies must
not leave a server behind). It does not read stdin: a harness may hand it /dev/null, which
would end the server at once.
"""

import argparse
import os
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=600)
    parser.add_argument("--backend", choices=["libuv", "legacy"])
    args = parser.parse_args()
    extra = {}
    if args.backend is not None:
        if not hasattr(dist.TCPStore, "libuvBackend"):
            parser.error("--backend needs torch 2.x")
        extra["use_libuv"] = args.backend == "libuv"

    # SIGTERM's default action already ends the process; exiting through Python is tidier.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    parent = os.getppid()
    # is_master=True runs the server on a background thread of this process (and connects
    # this store object to it as a client, which adds no keys without a world size).
    store = dist.TCPStore(args.host, args.port, None, True, timedelta(seconds=30), **extra)
    print(f"PORT {store.port}", flush=True)
    if hasattr(store, "libuvBackend"):
        print(f"BACKEND {'libuv' if store.libuvBackend else 'legacy'}", flush=True)

    give_up = time.monotonic() + args.max_seconds
    while os.getppid() == parent and time.monotonic() < give_up:
        time.sleep(0.2)  # not synchronisation: only how often to look for an orphaned server


if __name__ == "__main__":
    main()
