"""Many torch 2.x TCPStore clients at once against one server: each connects, does a few
operations and meets the others twice (an add/wait rendezvous, then the BARRIER request).

Run by tests/rendezvous/torch2_interop_test.cc with the pinned torch 2.x interpreter:

    python tests/torch/store_many_clients.py --port P [--host H] [--clients N] [--prefix S]

One thread per client, each with its own TCPStore object (its own connection); torch releases
the GIL while a store call blocks, so all N are in flight together. Client i:

    set <prefix>/client_i = "value-i"; get it back; add <prefix>/sum i
    add <prefix>/arrived 1; the one that makes it N sets <prefix>/go; everyone waits for it
    barrier <prefix>/barrier (world N)
    multi_get of two other clients' keys; check they hold their values

Prints "OK <N> clients sum <S>" (S = 0 + 1 + ... + N-1) and exits 0, or "FAIL <why>" and 1.
Every call is bounded by the store timeout (--timeout-s); the whole run by --timeout-s as well.
"""

import argparse
import sys
import threading
from datetime import timedelta

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--prefix", default="many")
    parser.add_argument("--timeout-s", type=float, default=60)
    args = parser.parse_args()
    n, p = args.clients, args.prefix
    timeout = timedelta(seconds=args.timeout_s)
    errors = []
    start = threading.Barrier(n, timeout=args.timeout_s)  # connect all at once

    def client(i):
        try:
            start.wait()
            store = dist.TCPStore(args.host, args.port, None, False, timeout)
            store.set(f"{p}/client_{i}", f"value-{i}")
            if store.get(f"{p}/client_{i}") != f"value-{i}".encode():
                raise AssertionError(f"client {i} read back a different value")
            store.add(f"{p}/sum", i)
            if store.add(f"{p}/arrived", 1) == n:
                store.set(f"{p}/go", b"1")
            store.wait([f"{p}/go"])
            store.barrier(f"{p}/barrier", n, timeout)
            others = [(i + 1) % n, (i + n // 2) % n]
            got = store.multi_get([f"{p}/client_{j}" for j in others])
            if got != [f"value-{j}".encode() for j in others]:
                raise AssertionError(f"client {i} multi_get {others} gave {got!r}")
        except Exception as e:  # collected and reported below
            errors.append(f"client {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.timeout_s)
    stuck = sum(t.is_alive() for t in threads)
    if stuck or errors:
        print(f"FAIL {stuck} client(s) still running, {len(errors)} error(s): "
              + "; ".join(errors[:5]), flush=True)
        sys.exit(1)
    total = dist.TCPStore(args.host, args.port, None, False, timeout).add(f"{p}/sum", 0)
    if total != n * (n - 1) // 2:
        print(f"FAIL sum is {total}, expected {n * (n - 1) // 2}", flush=True)
        sys.exit(1)
    print(f"OK {n} clients sum {total}", flush=True)


if __name__ == "__main__":
    main()
