#!/usr/bin/python3
"""Every reply byte of a cpprun-store daemon, for diffing two builds of the server.

    python3 store_wire_diff.py BUILD_A/cpprun-store > a.txt
    python3 store_wire_diff.py BUILD_B/cpprun-store > b.txt && diff a.txt b.txt

Starts the daemon on a free port and sends one fixed sequence of TCPStore requests over four
connections: every operation of the 2.2+ dialect and of the legacy one, deferred WAIT and
BARRIER replies woken by another connection, CANCEL_WAIT, queue pops of a full and an empty
queue, a legacy WATCH_KEY's created/updated/deleted pushes, and the two requests a server
answers by closing the connection. Prints each request and every byte each connection received
after it (30 ms later), in order. Used for issue 27's table-driven reply encoder: main's daemon
and the branch's gave identical output.
"""
import socket, struct, subprocess, sys, time, select

daemon = sys.argv[1]
p = subprocess.Popen([daemon, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
line = p.stdout.readline()
port = int(line.strip().rsplit(":", 1)[1])

def s(b): b = b.encode() if isinstance(b, str) else b; return struct.pack("<Q", len(b)) + b
def keys(ks): return struct.pack("<Q", len(ks)) + b"".join(s(k) for k in ks)
V2 = dict(VALIDATE=0, SET=1, CS=2, GET=3, ADD=4, CHECK=5, WAIT=6, NUM=7, DEL=8, APPEND=9, MGET=10,
          MSET=11, CANCEL=12, PING=13, QPUSH=14, QPOP=15, QLEN=16, LIST=17, BARRIER=18)
LEG = dict(SET=0, CS=1, GET=2, ADD=3, CHECK=4, WAIT=5, NUM=6, WATCH=7, DEL=8)

conns = {}
def conn(name):
    c = socket.create_connection(("127.0.0.1", port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conns[name] = c; return c
log = []
def drain():
    time.sleep(0.03)
    for name, c in conns.items():
        while True:
            r, _, _ = select.select([c], [], [], 0)
            if not r: break
            try: data = c.recv(65536)
            except OSError as e: log.append(f"{name} ERR {e}"); break
            if not data: log.append(f"{name} EOF"); conns[name] = socket.socket(); break
            log.append(f"{name} {data.hex()}")
def send(name, t, body=b""):
    log.append(f"-> {name} {t:02x} {body.hex()}")
    conns[name].sendall(bytes([t]) + body); drain()

for n in "AB": conn(n); send(n, V2["VALIDATE"], struct.pack("<I", 0x3C85F7CE))
send("A", V2["PING"], struct.pack("<I", 0x1234))
send("A", V2["SET"], s("k1") + s("v1"))
send("A", V2["GET"], s("k1"))
send("A", V2["GET"], s("missing"))
send("A", V2["ADD"], s("c") + struct.pack("<q", 5))
send("A", V2["ADD"], s("c") + struct.pack("<q", -9))
send("A", V2["CHECK"], keys(["k1"]))
send("A", V2["CHECK"], keys(["k1", "nope"]))
send("A", V2["WAIT"], keys(["k1"]))
send("B", V2["WAIT"], keys(["w1", "w2", "w1"]))
send("A", V2["SET"], s("w1") + s(""))
send("A", V2["SET"], s("w2") + s("x" * 300))
send("B", V2["WAIT"], keys(["w3"]))
send("B", V2["CANCEL"])
send("A", V2["SET"], s("w3") + s("y"))
send("A", V2["CS"], s("k1") + s("v1") + s("v2"))
send("A", V2["CS"], s("k1") + s("wrong") + s("v3"))
send("A", V2["CS"], s("absent") + s("") + s("new"))
send("A", V2["CS"], s("absent2") + s("e") + s("new"))
send("A", V2["NUM"])
send("A", V2["DEL"], s("k1"))
send("A", V2["DEL"], s("k1"))
send("A", V2["APPEND"], s("ap") + s("ab"))
send("A", V2["APPEND"], s("ap") + s("cd"))
send("A", V2["GET"], s("ap"))
send("A", V2["MGET"], keys(["ap", "c", "nope", "w2"]))
send("A", V2["MSET"], struct.pack("<Q", 2) + s("m1") + s("1") + s("m2") + s("22"))
send("A", V2["LIST"])
send("B", V2["WAIT"], keys(["q"]))
send("A", V2["QLEN"], s("q"))
send("A", V2["QPUSH"], s("q") + s("x1"))
send("A", V2["QPUSH"], s("q") + s("x2"))
send("A", V2["QLEN"], s("q"))
send("A", V2["QPOP"], s("q"))
send("A", V2["QPOP"], s("q"))
send("A", V2["QPOP"], s("q"))
send("A", V2["BARRIER"], s("bk") + struct.pack("<q", 2))
send("B", V2["BARRIER"], s("bk") + struct.pack("<q", 2))
send("A", V2["BARRIER"], s("bk") + struct.pack("<q", 1))
for n in "CD": conn(n)
send("D", LEG["WATCH"], s("wk"))
send("C", LEG["SET"], s("wk") + s("one"))
send("C", LEG["SET"], s("wk") + s("two"))
send("C", LEG["ADD"], s("wc") + struct.pack("<q", 3))
send("C", LEG["CS"], s("wk") + s("two") + s("three"))
send("C", LEG["GET"], s("wk"))
send("C", LEG["CHECK"], keys(["wk", "wc"]))
send("C", LEG["NUM"])
send("C", LEG["DEL"], s("wk"))
send("C", LEG["WAIT"], keys(["later"]))
send("A", V2["SET"], s("later") + s("z"))
send("C", LEG["GET"], s("gone"))           # legacy GET of a missing key: closed
send("A", V2["ADD"], s("ap") + struct.pack("<q", 1))  # ADD on text: closed
send("B", V2["NUM"])
p.terminate(); p.wait()
print("\n".join(log))
