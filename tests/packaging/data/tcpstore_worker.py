#!/usr/bin/env python3
"""A cpprun worker that needs no torch: it talks to the store its agent serves over the c10d
TCPStore wire protocol, as a torch worker would, and records what it saw.

    python3 tcpstore_worker.py --out DIR [--timeout S]   # as a cpprun worker (RANK, WORLD_SIZE,
                                                          # MASTER_ADDR, MASTER_PORT, ...)
    python3 tcpstore_worker.py --self-check               # the encoder against captured bytes

First the encoder and decoder are checked against bytes captured between torch 1.13.1's own
client and server (the project's shared TCPStore vectors, torch-1.13.json; VALIDATE and PING
from its protocol reference), so what goes on the wire below is what torch sends.

Then, on a torch 1.13 (legacy numbering) connection, as torch 1.13 does with
TORCHELASTIC_USE_AGENT_STORE=True (keys under "/worker/attempt_<n>", with TCPStore's own "/"):
`ADD init/ 1`; every other rank SETs "waiting/<rank>" and WAITs for the greeting in one send;
rank 0 WAITs for every "waiting/<rank>" and only then SETs the greeting, so the other ranks'
WAITs are answered late, by that SET, and they GET it; every rank ADDs 1 to a counter, the
last one SETs a key every rank WAITs for (a barrier through the store); the counter is read
back by `ADD 0` (an i64) and by GET (decimal text). Then a torch >= 2.2 connection (VALIDATE,
PING) GETs the greeting again and meets the other ranks at BARRIER. No sleeps.

Writes DIR/result-<RANK>.txt, one `name=value` a line (values are one line each), and exits 0;
any wrong reply raises (exit 1). Every socket operation is bounded by --timeout.
"""

import argparse
import os
import platform
import socket
import struct
import sys

# torch <= 2.0 (1.13) query types, and torch >= 2.2's.
LEGACY = {"SET": 0, "COMPARE_SET": 1, "GET": 2, "ADD": 3, "CHECK": 4, "WAIT": 5}
V2 = {"VALIDATE": 0, "SET": 1, "GET": 3, "ADD": 4, "WAIT": 6, "PING": 13, "BARRIER": 18}
VALIDATE_MAGIC = 0x3C85F7CE


def blob(b):
    return struct.pack("<Q", len(b)) + b


def enc_set(q, key, value):
    return bytes([q["SET"]]) + blob(key) + blob(value)


def enc_get(q, key):
    return bytes([q["GET"]]) + blob(key)


def enc_add(q, key, delta):
    return bytes([q["ADD"]]) + blob(key) + struct.pack("<q", delta)


def enc_wait(q, keys):
    return bytes([q["WAIT"]]) + struct.pack("<Q", len(keys)) + b"".join(blob(k) for k in keys)


def enc_validate():
    return bytes([V2["VALIDATE"]]) + struct.pack("<I", VALIDATE_MAGIC)


def enc_ping(nonce):
    return bytes([V2["PING"]]) + struct.pack("<I", nonce)


def enc_barrier(key, world_size):
    return bytes([V2["BARRIER"]]) + blob(key) + struct.pack("<q", world_size)


def dec_blob(b):
    (n,) = struct.unpack_from("<Q", b)
    if len(b) != 8 + n:
        raise ValueError("a value of %d bytes announced, %d came" % (n, len(b) - 8))
    return b[8:]


# (what this encoder sends, the bytes torch 1.13.1's client sent for the same call); replies.
VECTORS = [
    (enc_add(LEGACY, b"init/", 1), "030500000000000000696e69742f0100000000000000"),
    (enc_set(LEGACY, b"/key1", b"value1"),
     "0005000000000000002f6b657931060000000000000076616c756531"),
    (enc_wait(LEGACY, [b"/key1"]), "05010000000000000005000000000000002f6b657931"),
    (enc_wait(LEGACY, [b"/key1", b"/late_key"]),
     "05020000000000000005000000000000002f6b65793109000000000000002f6c6174655f6b6579"),
    (enc_get(LEGACY, b"/key1"), "0205000000000000002f6b657931"),
    (enc_add(LEGACY, b"/counter", -2), "0308000000000000002f636f756e746572feffffffffffffff"),
    (enc_set(LEGACY, b"//worker/attempt_0/default_pg/0/0/rank_1", b"vm"),
     "0028000000000000002f2f776f726b65722f617474656d70745f302f64656661756c745f70672f302f302f"
     "72616e6b5f310200000000000000766d"),
    (enc_validate() + enc_ping(4242), "00cef7853c0d92100000"),
]
REPLIES = [
    (dec_blob(bytes.fromhex("060000000000000076616c756531")), b"value1"),
    (dec_blob(bytes.fromhex("010000000000000033")), b"3"),
    (struct.unpack("<q", bytes.fromhex("0300000000000000"))[0], 3),
]


def self_check():
    for mine, captured in VECTORS:
        if mine != bytes.fromhex(captured):
            raise AssertionError("encoder sends %s, torch 1.13 sent %s" % (mine.hex(), captured))
    for mine, expected in REPLIES:
        if mine != expected:
            raise AssertionError("decoder read %r, not %r" % (mine, expected))


class Connection:
    """One blocking connection; at most one request in flight, as torch's client."""

    def __init__(self, addr, port, timeout, q):
        self.q = q
        self.s = socket.create_connection((addr, port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def recv_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise RuntimeError("the store closed the connection")
            out += chunk
        return out

    def send(self, b):
        self.s.sendall(b)

    def set(self, key, value):
        self.send(enc_set(self.q, key, value))

    def get(self, key):  # what torch's get() does: WAIT, then GET
        self.wait([key])
        self.send(enc_get(self.q, key))
        return self.recv_exact(struct.unpack("<Q", self.recv_exact(8))[0])

    def add(self, key, delta):
        self.send(enc_add(self.q, key, delta))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def wait(self, keys):
        self.send(enc_wait(self.q, keys))
        reply = self.recv_exact(1)
        if reply != b"\x00":
            raise RuntimeError("WAIT answered %s, not 00 (STOP_WAITING)" % reply.hex())

    def close(self):
        self.s.close()


def run(out_dir, timeout):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    addr = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # TCPStore's "/" + PrefixStore("/worker/attempt_<n>", ...)'s "/" join: as torch 1.13 workers
    # under an agent store name their keys on the wire.
    prefix = b"//worker/attempt_%s/cpprun_test/" % attempt.encode()
    greeting = b"hello from rank 0 (%s, pid %d)" % (platform.machine().encode(), os.getpid())

    legacy = Connection(addr, port, timeout, LEGACY)
    init_count = legacy.add(b"init/", 1)
    if rank == 0:
        # Only once every other rank's WAIT for the greeting is in: theirs are answered late.
        legacy.wait([prefix + b"waiting/%d" % r for r in range(1, world)])
        legacy.set(prefix + b"greeting", greeting)
        got = legacy.get(prefix + b"greeting")
    else:
        # One segment, so the store reads the WAIT right after the SET that lets rank 0 go on.
        legacy.send(enc_set(LEGACY, prefix + b"waiting/%d" % rank, b"1") +
                    enc_wait(LEGACY, [prefix + b"greeting"]))
        if legacy.recv_exact(1) != b"\x00":
            raise RuntimeError("WAIT for the greeting did not answer 00")
        legacy.send(enc_get(LEGACY, prefix + b"greeting"))
        got = legacy.recv_exact(struct.unpack("<Q", legacy.recv_exact(8))[0])
    if legacy.add(prefix + b"arrived", 1) == world:
        legacy.set(prefix + b"all_arrived", b"1")
    legacy.wait([prefix + b"all_arrived"])
    arrived = legacy.add(prefix + b"arrived", 0)
    arrived_text = legacy.get(prefix + b"arrived")
    legacy.close()

    v2 = Connection(addr, port, timeout, V2)
    nonce = os.getpid() & 0xFFFFFFFF
    v2.send(enc_validate() + enc_ping(nonce))
    echo = struct.unpack("<I", v2.recv_exact(4))[0]
    if echo != nonce:
        raise RuntimeError("PING %d echoed as %d" % (nonce, echo))
    v2_got = v2.get(prefix + b"greeting")
    v2.send(enc_barrier(prefix + b"barrier", world))
    barrier = v2.recv_exact(1)
    v2.close()

    fields = {
        "rank": rank,
        "world_size": world,
        "local_rank": os.environ.get("LOCAL_RANK"),
        "master": "%s:%d" % (addr, port),
        "use_agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "machine": platform.machine(),
        "init_count": init_count,
        "greeting": got.decode(),
        "arrived": arrived,
        "arrived_text": arrived_text.decode(),
        "v2_ping": "ok",
        "v2_greeting": v2_got.decode(),
        "barrier": barrier.hex(),
    }
    path = os.path.join(out_dir, "result-%d.txt" % rank)
    with open(path + ".tmp", "w") as f:
        f.writelines("%s=%s\n" % kv for kv in fields.items())
    os.rename(path + ".tmp", path)
    print("tcpstore_worker: rank %d of %d: got %r, counter %d, barrier %s"
          % (rank, world, got.decode(), arrived, barrier.hex()))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--self-check", action="store_true")
    a = p.parse_args()
    self_check()
    if a.self_check:
        print("tcpstore_worker: the encoder sends torch 1.13's bytes (%d vectors)" % len(VECTORS))
        return
    if not a.out:
        p.error("--out is required")
    run(a.out, a.timeout)


if __name__ == "__main__":
    main()
