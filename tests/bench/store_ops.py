#!/usr/bin/python3
"""A fixed amount of store_bench's mixed workload, for deterministic per-operation server costs.

    python3 store_ops.py --port P [--clients C] [--iterations N] [--dialect v2|legacy]

Opens C connections to a TCPStore server on 127.0.0.1:P (v2: VALIDATE + PING handshake, as
torch >= 2.2 and store_bench's "ours-v2" client do), then runs N iterations of store_bench's
iteration on every connection: SET own key, WAIT + GET it, ADD a shared counter, WAIT on an
existing key, COMPARE_SET own key (6 requests, 5 operations). The connections move in lockstep
from one thread: each request is sent on all C connections, then every reply is read, so a
server sees C ready connections per step, as under C client threads. Checks every reply and
exits 1 on a wrong one; prints "OPS <n> REQUESTS <n>".

With a fixed N, the difference between two runs (N and 2N) cancels start-up and connection
costs, so under `valgrind --tool=callgrind` or `strace -c -f` on the server it gives
instructions and syscalls per operation that do not depend on timing (for C = 1 exactly; for
C > 1 the batching per epoll_wait still depends on scheduling). Needs no torch.
"""

import argparse
import os
import socket
import struct
import sys

V2 = {"VALIDATE": 0, "SET": 1, "COMPARE_SET": 2, "GET": 3, "ADD": 4, "WAIT": 6, "PING": 13}
LEGACY = {"SET": 0, "COMPARE_SET": 1, "GET": 2, "ADD": 3, "WAIT": 5}


def blob(b):
    return struct.pack("<Q", len(b)) + b


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise RuntimeError("server closed the connection")
        out += chunk
    return out


def recv_blob(s):
    return recv_exact(s, struct.unpack("<Q", recv_exact(s, 8))[0])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--dialect", choices=["v2", "legacy"], default="v2")
    a = p.parse_args()
    q = V2 if a.dialect == "v2" else LEGACY
    socks = []
    for _ in range(a.clients):
        s = socket.create_connection(("127.0.0.1", a.port), timeout=60)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    if a.dialect == "v2":
        for s in socks:
            s.sendall(bytes([q["VALIDATE"]]) + struct.pack("<I", 0x3C85F7CE))
            s.sendall(bytes([q["PING"]]) + struct.pack("<I", 12345))
        for s in socks:
            if struct.unpack("<I", recv_exact(s, 4))[0] != 12345:
                sys.exit("store_ops: wrong PING echo")
    ready = b"bench/ready"
    socks[0].sendall(bytes([q["SET"]]) + blob(ready) + blob(b"1"))
    counter = b"bench/counter"
    tag = os.getpid()  # own keys per run, so runs can follow each other on one server
    value = b"v" * 32
    cas = [b"" for _ in socks]
    requests = 0
    for it in range(a.iterations):
        keys = [b"bench/%d/k/%d" % (tag, i) for i in range(len(socks))]
        for i, s in enumerate(socks):
            # One send: whether the server reads SET and WAIT together would otherwise
            # depend on timing.
            s.sendall(bytes([q["SET"]]) + blob(keys[i]) + blob(value) + bytes([q["WAIT"]]) +
                      struct.pack("<Q", 1) + blob(keys[i]))
        for s in socks:
            if recv_exact(s, 1) != b"\0":
                sys.exit("store_ops: WAIT reply")
        for i, s in enumerate(socks):
            s.sendall(bytes([q["GET"]]) + blob(keys[i]))
        for s in socks:
            if recv_blob(s) != value:
                sys.exit("store_ops: GET returned a wrong value")
        for s in socks:
            s.sendall(bytes([q["ADD"]]) + blob(counter) + struct.pack("<q", 1))
        for s in socks:
            recv_exact(s, 8)
        for s in socks:
            s.sendall(bytes([q["WAIT"]]) + struct.pack("<Q", 1) + blob(ready))
        for s in socks:
            if recv_exact(s, 1) != b"\0":
                sys.exit("store_ops: WAIT reply")
        desired = [b"%d" % (it + 1) for _ in socks]
        for i, s in enumerate(socks):
            s.sendall(bytes([q["COMPARE_SET"]]) + blob(b"bench/%d/cas/%d" % (tag, i)) + blob(cas[i]) +
                      blob(desired[i]))
        for i, s in enumerate(socks):
            if recv_blob(s) != desired[i]:
                sys.exit("store_ops: COMPARE_SET did not succeed")
            cas[i] = desired[i]
        requests += 6 * len(socks)
    for s in socks:
        s.close()
    print("OPS %d REQUESTS %d" % (5 * a.iterations * len(socks), requests))


if __name__ == "__main__":
    main()
