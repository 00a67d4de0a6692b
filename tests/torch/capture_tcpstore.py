#!/usr/bin/env python3
"""Capture byte-level TCPStore traffic between real torch clients and real torch TCPStore
servers, through a logging TCP proxy on 127.0.0.1, for any torch from 1.13 to 2.x.

    PYTHON capture_tcpstore.py OUTPUT.json

PYTHON is the interpreter of the torch to capture (never one without torch):
  /usr/bin/python3                      Debian's torch 1.13  -> tests/rendezvous/data/torch-1.13.json
  /opt/cpprun/torch21/bin/python        torch 2.1.x           -> tests/rendezvous/data/torch-2.1.json
  /opt/cpprun/torch2/bin/python         the pinned torch 2.x  -> tests/rendezvous/data/torch-2.15.json
(torch-1.13.json was made by the project's earlier 1.13-only capture script, with the 1.13-only
scenarios WATCH_KEY and the callback connection; this script also runs under 1.13.)

The query-type numbering used to decode and to build raw requests is chosen from the torch
version (<= 2.0: 1.13 numbering; 2.1: WATCH_KEY removed; >= 2.2: VALIDATE = 0). torch >= 2.1
has two servers (libuv, and the legacy one selected by use_libuv=False); every scenario runs
once per server, on its own server, proxy and connection numbering, and carries `server`.

Everything listens on and connects to 127.0.0.1 only. Per server the script starts one
TCPStore server in a child process, a logging proxy in another child process (some torch
bindings hold the GIL while blocked on a socket), real TCPStore clients in this process that
talk to the proxy, raw-socket clients for what the Python API cannot send, and two child
processes that run init_process_group('gloo', 'env://').

Clients whose traffic is not proxied (the script's own "direct" client, rank 0 hosting its own
server) are written down as `hidden_actions` of the scenario: {before, op, key, value_hex |
delta, by}: a replayer performs them just before exchange number `before`.
"""
import datetime
import json
import tempfile
import os
import socket
import struct
import subprocess
import sys
import threading
import time

LOOPBACK = "127.0.0.1"

# ---------------------------------------------------------------- numbering --
NUMBERINGS = {
    "1.13": ["SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "WATCH_KEY",
             "DELETE_KEY"],
    "2.1": ["SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY",
            "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT"],
    "2.2+": ["VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS",
             "DELETE_KEY", "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",
             "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS", "BARRIER"],
}
VALIDATION_MAGIC = 0x3C85F7CE


def dialect_of(version):
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    if (major, minor) <= (2, 0):
        return "1.13"
    if (major, minor) == (2, 1):
        return "2.1"
    return "2.2+"


DIALECT = None  # set in main() from torch.__version__
QNAME = {}      # wire byte -> name
QNUM = {}       # name -> wire byte


def set_dialect(d):
    global DIALECT
    DIALECT = d
    QNAME.clear(); QNUM.clear()
    for i, n in enumerate(NUMBERINGS[d]):
        QNAME[i] = n
        QNUM[n] = i


CHECK_RESP = {0: "READY", 1: "NOT_READY"}
WAIT_RESP = {0: "STOP_WAITING", 1: "WAIT_CANCELED"}
WATCH_RESP = {0: "KEY_UPDATED", 1: "KEY_CREATED", 2: "KEY_DELETED",
              3: "KEY_CALLBACK_REGISTERED"}


class Need(Exception):
    """Not enough bytes to finish parsing a message."""


class Reader:
    def __init__(self, data):
        self.d = data
        self.p = 0

    def take(self, n):
        if self.p + n > len(self.d):
            raise Need()
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def u8(self):
        return self.take(1)[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def i64(self):
        return struct.unpack("<q", self.take(8))[0]

    def blob(self, limit=1 << 24):
        n = self.u64()
        if n > limit:
            raise ValueError("length %d too large" % n)
        return self.take(n)

    def count(self):
        n = self.u64()
        if n > 131072:
            raise ValueError("key count %d too large" % n)
        return n


def show(b):
    if len(b) > 48:
        return "%r...(%d bytes)" % (bytes(b[:32]), len(b))
    return repr(bytes(b))


def parse_request(r):
    """Parses one request in the current dialect.

    Returns (name, text, expected_response_kind or None, info) where info is a dict with the
    op, keys, values and integer, used to infer what unproxied clients did."""
    q = r.u8()
    name = QNAME.get(q)
    if name is None:
        raise ValueError("unknown query type %d for torch %s numbering" % (q, DIALECT))
    info = {"op": name, "keys": [], "values": []}
    if name == "VALIDATE":
        m = r.u32()
        return name, "VALIDATE magic=0x%08X%s" % (m, "" if m == VALIDATION_MAGIC else
                                                   " (wrong)"), None, info
    if name == "PING":
        n = r.u32()
        return name, "PING nonce=%d" % n, "u32", info
    if name in ("SET", "APPEND", "QUEUE_PUSH"):
        k = r.blob(); v = r.blob()
        info["keys"], info["values"] = [k], [v]
        return name, "%s key=%s value=%s" % (name, show(k), show(v)), None, info
    if name == "COMPARE_SET":
        k = r.blob(); e = r.blob(); d = r.blob()
        info["keys"], info["values"] = [k], [e, d]
        return name, "COMPARE_SET key=%s expected=%s desired=%s" % (
            show(k), show(e), show(d)), "vec", info
    if name in ("GET", "WATCH_KEY", "DELETE_KEY", "QUEUE_POP", "QUEUE_LEN"):
        k = r.blob()
        info["keys"] = [k]
        kind = {"GET": "vec", "WATCH_KEY": "watch", "DELETE_KEY": "i64", "QUEUE_POP": "qpop",
                "QUEUE_LEN": "i64"}[name]
        return name, "%s key=%s" % (name, show(k)), kind, info
    if name in ("ADD", "BARRIER"):
        k = r.blob(); v = r.i64()
        info["keys"], info["integer"] = [k], v
        return name, "%s key=%s %s=%d" % (name, show(k), "delta" if name == "ADD" else
                                          "world_size", v), (
            "i64" if name == "ADD" else "wait"), info
    if name in ("CHECK", "WAIT", "MULTI_GET"):
        n = r.count()
        keys = [r.blob() for _ in range(n)]
        info["keys"] = keys
        kind = {"CHECK": "check", "WAIT": "wait", "MULTI_GET": "multi%d" % n}[name]
        return name, "%s nkeys=%d keys=[%s]" % (name, n, ", ".join(show(k) for k in keys)), \
            kind, info
    if name == "MULTI_SET":
        n = r.count()
        for _ in range(n):
            info["keys"].append(r.blob())
            info["values"].append(r.blob())
        return name, "MULTI_SET n=%d %s" % (n, ", ".join(
            "%s=%s" % (show(k), show(v)) for k, v in zip(info["keys"], info["values"]))), \
            None, info
    if name in ("GETNUMKEYS", "LIST_KEYS"):
        return name, name, ("i64" if name == "GETNUMKEYS" else "list"), info
    if name == "CANCEL_WAIT":
        return name, "CANCEL_WAIT", "cancel", info
    raise AssertionError(name)


def parse_response(r, kind):
    """Returns (text, value) of one reply; value is the bytes/int it carries."""
    if kind == "vec":
        v = r.blob()
        return "value=%s" % show(v), v
    if kind == "i64":
        v = r.i64()
        return "int64=%d" % v, v
    if kind == "u32":
        v = r.u32()
        return "uint32=%d" % v, v
    if kind == "check":
        b = r.u8()
        return "CheckResponseType=%d (%s)" % (b, CHECK_RESP.get(b, "?")), b
    if kind in ("wait", "cancel"):
        b = r.u8()
        return "WaitResponseType=%d (%s)" % (b, WAIT_RESP.get(b, "?")), b
    if kind == "watch":
        b = r.u8()
        return "WatchResponseType=%d (%s)" % (b, WATCH_RESP.get(b, "?")), b
    if kind == "qpop":
        n = r.i64()
        if n > 0:
            v = r.blob()
            return "queue length before pop=%d value=%s" % (n, show(v)), v
        return "queue length before pop=%d (empty)" % n, None
    if kind == "list":
        n = r.count()
        keys = [r.blob() for _ in range(n)]
        return "count=%d keys=[%s]" % (n, ", ".join(show(k) for k in keys)), keys
    if kind.startswith("multi"):
        vals = [r.blob() for _ in range(int(kind[5:]))]
        return "values=[%s]" % ", ".join(show(v) for v in vals), vals
    raise AssertionError(kind)


def parse_watch_event(r):
    t = r.u8()
    if t == 3:
        return "WatchResponseType=3 (KEY_CALLBACK_REGISTERED)"
    k = r.blob(); old = r.blob(); new = r.blob()
    return "watch event %s key=%s old=%s new=%s" % (
        WATCH_RESP.get(t, "?%d" % t), show(k), show(old), show(new))


class ConnDecoder:
    """Splits each direction of one connection into protocol messages.

    Replies are matched to requests first in, first out. CANCEL_WAIT: when a WAIT is still
    unanswered, a reply byte 1 (WAIT_CANCELED) answers the cancel and the WAIT gets none; a
    byte 0 answers the WAIT (the wake-up raced the cancel) and the cancel's 1 follows."""

    def __init__(self):
        self.pending = []  # [name, kind, info], FIFO
        self.cbuf = b""
        self.sbuf = b""
        self.broken = False

    def feed(self, direction, data):
        out = []  # (name, bytes, decoded, info)
        if self.broken:
            return [("unparsed", data, "(stream not decodable after earlier error)", None)]
        if direction == "client->server":
            self.cbuf += data
            while self.cbuf:
                r = Reader(self.cbuf)
                try:
                    name, text, exp, info = parse_request(r)
                except Need:
                    break
                except ValueError as e:
                    out.append(("unparsed request", self.cbuf,
                                "not a valid torch-%s request: %s" % (DIALECT, e), None))
                    self.cbuf = b""
                    self.broken = True
                    break
                msg, self.cbuf = self.cbuf[:r.p], self.cbuf[r.p:]
                if exp:
                    self.pending.append([name, exp, info])
                out.append((name + " request", msg, text, info))
        else:
            self.sbuf += data
            while self.sbuf:
                r = Reader(self.sbuf)
                try:
                    if self.pending:
                        name, kind, info = self.pending[0]
                        if (kind == "wait" and len(self.pending) > 1 and
                                self.pending[1][1] == "cancel" and self.sbuf[:1] == b"\x01"):
                            self.pending.pop(0)  # canceled: the WAIT gets no reply
                            name, kind, info = self.pending[0]
                        text, value = parse_response(r, kind)
                    else:
                        name, text, value, info = "WATCH", parse_watch_event(r), None, None
                except Need:
                    break
                except ValueError as e:
                    out.append(("unparsed response", self.sbuf, str(e), None))
                    self.sbuf = b""
                    break
                if self.pending:
                    self.pending.pop(0)
                msg, self.sbuf = self.sbuf[:r.p], self.sbuf[r.p:]
                out.append((name + " response" if name != "WATCH" else "watch notification",
                            msg, text, {"reply_to": info, "value": value}))
        return out

    def leftovers(self):
        res = []
        if self.cbuf:
            res.append(("incomplete request", "client->server", self.cbuf))
        if self.sbuf:
            res.append(("incomplete response", "server->client", self.sbuf))
        self.cbuf = self.sbuf = b""
        return res


# ------------------------------------------------------------------- proxy --
class Proxy:
    """Logging TCP proxy run in its own process (so that torch calls that hold
    the Python GIL while blocking on the socket cannot stall it).  Every chunk
    read from either side is appended as one JSON line to a log file."""

    def __init__(self, upstream_port, log_path):
        self.log_path = log_path
        open(log_path, "w").close()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--proxy", str(upstream_port), log_path],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("PROXY"), line
        self.port = int(line.split()[1])

    def _read(self):
        evs = []
        with open(self.log_path) as f:
            for line in f:
                if line.endswith("\n"):
                    e = json.loads(line)
                    e["data"] = bytes.fromhex(e.pop("hex"))
                    evs.append(e)
        return evs

    def mark(self):
        return len(self._read())

    def quiesce(self, idle=0.25, limit=10.0):
        end = time.time() + limit
        while time.time() < end:
            evs = self._read()
            last = evs[-1]["t"] if evs else 0
            if time.time() - last >= idle:
                return
            time.sleep(0.02)

    def slice(self, start, end=None):
        return self._read()[start:end]

    def stop(self):
        self.proc.kill()


def proxy_main(upstream_port, log_path):
    lock = threading.Lock()
    logf = open(log_path, "a")
    state = {"n": 0}

    def log(cid, direction, data=b""):
        with lock:
            logf.write(json.dumps({"t": time.time(), "conn": cid, "direction": direction,
                                   "hex": data.hex()}) + "\n")
            logf.flush()

    def serve(c, cid):
        up = None
        deadline = time.time() + 60
        while up is None:
            try:
                up = socket.create_connection((LOOPBACK, upstream_port))
            except OSError:
                if time.time() > deadline:
                    c.close()
                    return
                time.sleep(0.05)
        for s in (c, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        log(cid, "connect")

        def pump(src, dst, direction):
            while True:
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    log(cid, "close " + direction)
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                log(cid, direction, data)
                try:
                    dst.sendall(data)
                except OSError:
                    return

        t1 = threading.Thread(target=pump, args=(c, up, "client->server"), daemon=True)
        t2 = threading.Thread(target=pump, args=(up, c, "server->client"), daemon=True)
        t1.start(); t2.start(); t1.join(); t2.join()
        c.close(); up.close()

    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((LOOPBACK, 0))
    ls.listen(64)
    print("PROXY", ls.getsockname()[1], flush=True)
    while True:
        c, _ = ls.accept()
        state["n"] += 1
        threading.Thread(target=serve, args=(c, state["n"]), daemon=True).start()


# --------------------------------------------------------------- scenarios --
class Recorder:
    """Runs scenarios one after another against one proxy and turns the proxy's log into
    per-message exchanges. Actions of clients that bypass the proxy are noted with note()."""

    def __init__(self, proxy, server):
        self.proxy = proxy
        self.server = server
        self.scenarios = []
        self.decoders = {}
        self.notes_hidden = None

    def note(self, op, key, value=None, delta=None, by="unproxied client of the script"):
        if self.notes_hidden is not None:
            self.notes_hidden.append((self.proxy.mark(), op, key, value, delta, by))

    def run(self, name, description, kind, body, calls=None, settle=0.3, infer_peer=None):
        self.proxy.quiesce()
        start = self.proxy.mark()
        self.notes_hidden = []
        t0 = time.time()
        notes = []
        try:
            res = body(notes)
            if res is not None:
                notes.append("result: %r" % (res,))
        except Exception as e:  # record client-visible errors, they are data
            notes.append("client raised %s: %s" % (type(e).__name__, str(e).splitlines()[0]))
        time.sleep(settle)
        self.proxy.quiesce(idle=settle)
        evs = self.proxy.slice(start)
        exchanges, infos, before_event = [], [], []
        # Each chunk read by the proxy is fed to a per-connection decoder, which cuts the byte
        # stream into protocol messages; a message carries the time of the chunk completing it.
        for ev in evs:
            before_event.append(len(exchanges))
            cid = ev["conn"]
            dec = self.decoders.setdefault(cid, ConnDecoder())
            t_ms = round((ev["t"] - t0) * 1000.0, 1)
            if not ev["data"]:
                what = ev["direction"]
                if what == "connect":
                    nm = "TCP connection #%d opened by client" % cid
                elif what == "close client->server":
                    nm = "client closed connection #%d (EOF from client)" % cid
                else:
                    nm = "server closed connection #%d (EOF from server)" % cid
                for lname, ldir, lbytes in dec.leftovers():
                    exchanges.append({"name": lname, "direction": ldir, "conn": cid,
                                      "t_ms": t_ms, "hex": lbytes.hex(),
                                      "decoded": "bytes left unparsed at close"})
                    infos.append(None)
                exchanges.append({"name": nm, "direction": "event", "conn": cid,
                                  "t_ms": t_ms, "hex": ""})
                infos.append(None)
                continue
            for mname, mbytes, text, info in dec.feed(ev["direction"], ev["data"]):
                if info is not None and ev["direction"] == "client->server":
                    info["index"] = len(exchanges)
                exchanges.append({"name": mname, "direction": ev["direction"],
                                  "conn": cid, "t_ms": t_ms, "hex": mbytes.hex(),
                                  "decoded": text})
                infos.append(info)
        before_event.append(len(exchanges))
        hidden = []
        for mark, op, key, value, delta, by in self.notes_hidden:
            rel = min(max(mark - start, 0), len(evs))
            hidden.append(hidden_action(before_event[rel], op, key, value, delta, by))
        self.notes_hidden = None
        if infer_peer:
            hidden += infer_hidden(exchanges, infos, infer_peer)
        hidden.sort(key=lambda h: h["before"])
        sc = {"name": name, "server": self.server, "kind": kind, "description": description,
              "api_calls": calls or [], "exchanges": exchanges}
        if hidden:
            sc["hidden_actions"] = hidden
        if notes:
            sc["notes"] = notes
        self.scenarios.append(sc)
        print("[%s/%s] %d exchanges %s" % (self.server, name, len(exchanges), notes),
              flush=True)
        return sc


def hidden_action(before, op, key, value, delta, by):
    h = {"before": before, "op": op, "key": key.decode() if isinstance(key, bytes) else key,
         "by": by}
    if value is not None:
        h["value_hex"] = (value if isinstance(value, bytes) else value.encode()).hex()
    if delta is not None:
        h["delta"] = delta
    return h


def infer_hidden(exchanges, infos, by):
    """What an unproxied peer (rank 0 on its own server) must have done, from the replies the
    proxied client got: a key it WAITed for or read appears, with the value it later read; an
    ADD that returns more than the visible adds explain was preceded by the peer's ADD."""
    state, out = {}, []

    def later_value(i, key):
        for ex, info in zip(exchanges[i:], infos[i:]):
            if ex["direction"] != "server->client" or not info or not info.get("reply_to"):
                continue
            req = info["reply_to"]
            if req["op"] == "GET" and req["keys"] == [key]:
                return info["value"]
            if req["op"] == "MULTI_GET" and key in req["keys"]:
                return info["value"][req["keys"].index(key)]
        return None

    for i, (ex, info) in enumerate(zip(exchanges, infos)):
        if not info:
            continue
        if ex["direction"] == "client->server":
            op = info["op"]
            if op in ("SET", "MULTI_SET"):
                state.update(zip(info["keys"], info["values"]))
            elif op == "APPEND":
                state[info["keys"][0]] = state.get(info["keys"][0], b"") + info["values"][0]
            elif op == "COMPARE_SET":
                k = info["keys"][0]
                if state.get(k, b"") == info["values"][0]:
                    state[k] = info["values"][1]
            elif op in ("WAIT", "GET", "MULTI_GET"):
                for k in info["keys"]:
                    if k in state:
                        continue
                    v = later_value(i, k)
                    if v is None:
                        v = b"set-by-peer"
                    out.append(hidden_action(i, "set", k, v, None, by))
                    state[k] = v
        elif info.get("reply_to") and info["reply_to"]["op"] == "ADD":
            req = info["reply_to"]
            k, d = req["keys"][0], req["integer"]
            prev = int(state.get(k, b"0") or b"0")
            if prev + d != info["value"]:
                out.append(hidden_action(req["index"], "add", k, None,
                                         info["value"] - d - prev, by))
            state[k] = str(info["value"]).encode()
    return out


def free_port():
    s = socket.socket()
    s.bind((LOOPBACK, 0))
    p = s.getsockname()[1]
    s.close()
    return p


SERVER_CODE = r"""
import sys, time, datetime
import torch.distributed as dist
port, kind = int(sys.argv[1]), sys.argv[2]
kw = {} if kind == "1.13" else {"use_libuv": kind == "libuv"}
s = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=60), **kw)
print("READY", s.port, flush=True)
time.sleep(3600)
"""

WORKER_CODE = r"""
import os, sys, datetime
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
r = dist.get_rank()
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
dist.barrier()
print("rank", r, "world", dist.get_world_size(), "all_reduce", t.item(), flush=True)
dist.destroy_process_group()
"""


def start_server(port, kind):
    p = subprocess.Popen([sys.executable, "-c", SERVER_CODE, str(port), kind],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        raise RuntimeError("torch %s server did not start: %r" % (kind, line))
    return p, int(line.split()[1])


def raw_client(proxy_port):
    s = socket.create_connection((LOOPBACK, proxy_port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(3.0)
    return s


def recv_some(s, n, timeout=3.0):
    s.settimeout(timeout)
    buf = b""
    try:
        while len(buf) < n:
            d = s.recv(n - len(buf))
            if not d:
                return buf, "EOF"
            buf += d
    except socket.timeout:
        return buf, "timeout"
    except OSError as e:
        return buf, "error %s" % e
    return buf, "ok"


def enc_str(b):
    return struct.pack("<Q", len(b)) + b


def q(name):
    return bytes([QNUM[name]])


def hello():
    """What a client of this torch sends first on a raw connection (2.2+: VALIDATE)."""
    return q("VALIDATE") + struct.pack("<I", VALIDATION_MAGIC) if "VALIDATE" in QNUM else b""


class Direct:
    """The script's own client, straight to the server (not proxied); every write is noted
    as a hidden action of the running scenario."""

    def __init__(self, store, rec):
        self.s, self.rec = store, rec

    def set(self, key, value):
        self.rec.note("set", "/" + key, value)
        self.s.set(key, value)

    def delete_key(self, key):
        self.rec.note("delete_key", "/" + key)
        return self.s.delete_key(key)

    def queue_push(self, key, value):
        self.rec.note("queue_push", "/" + key, value)
        self.s.queue_push(key, value)

    def num_keys(self):
        return self.s.num_keys()


def run_workers(envs):
    procs = []
    for env in envs:
        e = dict(os.environ)
        e.update(env)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER_CODE], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
        outs.append(o.strip().splitlines()[-1] if o.strip() else
                    "(no output) rc=%d" % p.returncode)
    return outs


def capture_server(kind, workdir, scenarios):
    """Every scenario against one fresh torch server of `kind` ("libuv", "legacy", "1.13")."""
    import torch.distributed as dist
    TD = datetime.timedelta
    srv, srv_port = start_server(0, kind)
    proxy = Proxy(srv_port, os.path.join(workdir, kind + ".log"))
    rec = Recorder(proxy, kind)
    direct = Direct(dist.TCPStore(LOOPBACK, srv_port, None, False, TD(seconds=30)), rec)
    holder = {}
    v2 = "VALIDATE" in QNUM

    def connect_plain(notes):
        holder["a"] = dist.TCPStore(LOOPBACK, proxy.port, None, False, TD(seconds=30))
    rec.run("connect_without_world_size",
            "A client TCPStore created with world_size=None: what it sends on connecting "
            "(2.2+: VALIDATE; 2.5+: then PING with its pid, echoed by the server; 2.1: nothing; "
            "1.13 opens a second silent 'callback' connection).", "real-client", connect_plain,
            ["TCPStore('127.0.0.1', port, world_size=None, is_master=False)"])

    def connect_ws(notes):
        holder["s"] = dist.TCPStore(LOOPBACK, proxy.port, 2, False, TD(seconds=30))
    rec.run("connect_with_world_size",
            "A client TCPStore created with world_size=2 and wait_for_workers=True (the "
            "default): after the handshake it adds 1 to key 'init/' (no leading slash).",
            "real-client", connect_ws,
            ["TCPStore('127.0.0.1', port, world_size=2, is_master=False, wait_for_workers=True)"])
    s = holder["s"]

    rec.run("set", "set() sends SET; the server sends no reply.", "real-client",
            lambda n: s.set("key1", b"value1"), ["store.set('key1', b'value1')"])
    rec.run("set_str_value", "A Python str value is sent as its UTF-8 bytes.", "real-client",
            lambda n: s.set("greeting", "h\u00e9llo"), ["store.set('greeting', 'h\\u00e9llo')"])
    rec.run("set_empty_value", "Empty value: length prefix 0 and no payload.", "real-client",
            lambda n: s.set("empty", b""), ["store.set('empty', b'')"])
    rec.run("set_binary_value", "Binary value with NUL and 0xff bytes.", "real-client",
            lambda n: s.set("bin", b"\x00\x01\xff\x00"),
            ["store.set('bin', b'\\x00\\x01\\xff\\x00')"])
    big = bytes(range(256)) * 12
    rec.run("set_large_value", "A 3072-byte value: same framing, only the length differs.",
            "real-client", lambda n: s.set("big", big),
            ["store.set('big', bytes(range(256)) * 12)"])
    rec.run("get_existing", "get() is WAIT(1 key) + STOP_WAITING, then GET + value.",
            "real-client", lambda n: s.get("key1"), ["store.get('key1')"])

    def delayed(fn, delay):
        th = threading.Thread(target=lambda: (time.sleep(delay), fn()), daemon=True)
        th.start()
        return th

    def get_blocking(notes):
        th = delayed(lambda: direct.set("late_get", b"arrived"), 1.0)
        v = s.get("late_get")
        th.join()
        return v
    rec.run("get_blocking", "get() of a key that another (unproxied) client sets about 1 s "
            "later: STOP_WAITING arrives only when the key is set, then GET runs.",
            "real-client", get_blocking,
            ["store.get('late_get')  # set by another client after ~1 s"])

    def adds(notes):
        return [s.add("counter", 5), s.add("counter", -2), s.add("counter", 0)]
    rec.run("add", "ADD returns the new value as int64; the server stores decimal ASCII text.",
            "real-client", adds,
            ["store.add('counter', 5)", "store.add('counter', -2)", "store.add('counter', 0)"])
    rec.run("get_counter_text", "A counter made by ADD reads back as ASCII digits.",
            "real-client", lambda n: s.get("counter"), ["store.get('counter')"])

    def cas(notes):
        return [s.compare_set("cas_new", "", "first"), s.compare_set("cas_missing", "x", "y"),
                s.compare_set("cas_new", "first", "second"),
                s.compare_set("cas_new", "nomatch", "third")]
    rec.run("compare_set", "Four COMPARE_SET cases: missing+expected empty (stores desired), "
            "missing+expected non-empty (returns expected, stores nothing), match (swaps), "
            "mismatch (returns current).", "real-client", cas,
            ["store.compare_set('cas_new', '', 'first')",
             "store.compare_set('cas_missing', 'x', 'y')",
             "store.compare_set('cas_new', 'first', 'second')",
             "store.compare_set('cas_new', 'nomatch', 'third')"])
    rec.run("wait_ready", "wait() on keys that exist: WAIT(2 keys) answered at once.",
            "real-client", lambda n: s.wait(["key1", "counter"]),
            ["store.wait(['key1', 'counter'])"])

    def wait_blocking(notes):
        th = delayed(lambda: direct.set("late_key", b"1"), 1.0)
        s.wait(["key1", "late_key"])
        th.join()
    rec.run("wait_blocking", "wait() on one present and one absent key; the absent key is set "
            "by another client ~1 s later and only then STOP_WAITING is sent.",
            "real-client", wait_blocking, ["store.wait(['key1', 'late_key'])"])

    def wait_timeout(notes):
        w = dist.TCPStore(LOOPBACK, proxy.port, None, False, TD(seconds=30))
        holder["w"] = w
        try:
            w.wait(["never"], TD(seconds=1))
            notes.append("wait returned (unexpected)")
        except Exception as ex:
            notes.append("wait raised %s: %s" % (type(ex).__name__, str(ex).splitlines()[0]))
        direct.set("never", b"now")
        n1 = w.num_keys()
        notes.append("num_keys() after the timed-out wait returned %d (true count %d)"
                     % (n1, direct.num_keys()))
        return n1
    rec.run("wait_timeout", "wait(timeout=1s) on a key nobody sets, on a fresh client. 1.13: "
            "the client only times out locally (the late STOP_WAITING desyncs it). 2.1+: the "
            "client sends CANCEL_WAIT and reads WAIT_CANCELED; its next request (GETNUMKEYS "
            "after another client set the key) gets the right answer.",
            "real-client", wait_timeout,
            ["store.wait(['never'], timedelta(seconds=1))  # times out",
             "other_client.set('never', b'now')", "store.num_keys()"])

    if hasattr(dist.TCPStore, "check"):
        rec.run("check", "check(): CHECK with the keys; 0 = READY (all exist), 1 = NOT_READY.",
                "real-client", lambda n: [s.check(["key1", "counter"]),
                                          s.check(["key1", "absent"])],
                ["store.check(['key1', 'counter'])", "store.check(['key1', 'absent'])"])
    else:
        def raw_check(notes):
            c = raw_client(proxy.port)
            c.sendall(hello() + q("CHECK") + struct.pack("<Q", 1) + enc_str(b"/counter"))
            a, st1 = recv_some(c, 1)
            c.sendall(q("CHECK") + struct.pack("<Q", 2) + enc_str(b"/counter") +
                      enc_str(b"/absent"))
            b, st2 = recv_some(c, 1)
            c.close()
            return (a.hex(), st1, b.hex(), st2)
        rec.run("check", "CHECK is not in this torch's Python API: request bytes built by hand, "
                "replies from the real server: 0=READY, 1=NOT_READY.", "synthetic-client",
                raw_check, ["raw: CHECK ['/counter']", "raw: CHECK ['/counter', '/absent']"])

    rec.run("num_keys", "GETNUMKEYS counts every key in the server (incl. 'init/').",
            "real-client", lambda n: s.num_keys(), ["store.num_keys()"])
    rec.run("delete_key", "DELETE_KEY returns the number of keys erased (1 or 0) as int64.",
            "real-client", lambda n: [s.delete_key("key1"), s.delete_key("key1")],
            ["store.delete_key('key1')", "store.delete_key('key1')"])
    if hasattr(dist.TCPStore, "append"):
        rec.run("append", "APPEND creates a missing key and concatenates onto an existing "
                "one; no reply. get() reads the result.", "real-client",
                lambda n: [s.append("log", b"ab"), s.append("log", b"cd"), s.get("log")],
                ["store.append('log', b'ab')", "store.append('log', b'cd')", "store.get('log')"])
        rec.run("multi_set", "multi_set(): one MULTI_SET, no reply.", "real-client",
                lambda n: s.multi_set(["m1", "m2", "m3"], [b"v1", b"", b"v3"]),
                ["store.multi_set(['m1', 'm2', 'm3'], [b'v1', b'', b'v3'])"])
        rec.run("multi_get", "multi_get(): WAIT for all keys, then MULTI_GET; values in request "
                "order.", "real-client", lambda n: s.multi_get(["m3", "m1", "m2", "log"]),
                ["store.multi_get(['m3', 'm1', 'm2', 'log'])"])
    def fresh():
        """A new proxied client: the legacy server drops a connection on the types it does not
        know, so each of the newest operations gets its own connection."""
        c = dist.TCPStore(LOOPBACK, proxy.port, None, False, TD(seconds=10))
        holder.setdefault("fresh", []).append(c)
        return c

    if hasattr(dist.TCPStore, "queue_push"):
        rec.run("queue_ops", "queue_push twice, queue_len, queue_pop twice, queue_len, "
                "queue_pop(block=False) on the empty queue (libuv server only; the legacy "
                "server does not know these types).", "real-client",
                lambda n, c=None: (lambda c: [
                    c.queue_push("q", b"one"), c.queue_push("q", b"two"), c.queue_len("q"),
                    c.queue_pop("q"), c.queue_pop("q"), c.queue_len("q"),
                    c.queue_pop("q", block=False)])(fresh()),
                ["store.queue_push('q', b'one')", "store.queue_push('q', b'two')",
                 "store.queue_len('q')", "store.queue_pop('q')", "store.queue_pop('q')",
                 "store.queue_len('q')", "store.queue_pop('q', block=False)"])

        def queue_blocking(notes):
            c = fresh()
            th = delayed(lambda: direct.queue_push("q2", b"late"), 1.0)
            v = c.queue_pop("q2")
            th.join()
            return v
        rec.run("queue_pop_blocking", "queue_pop() of an empty queue: WAIT on the queue key "
                "until another client pushes ~1 s later, then QUEUE_POP.", "real-client",
                queue_blocking, ["store.queue_pop('q2')  # pushed by another client after ~1 s"])
    if hasattr(dist.TCPStore, "list_keys"):
        rec.run("list_keys", "list_keys(): LIST_KEYS returns every key of the server; the "
                "client keeps those with its '/' prefix.", "real-client",
                lambda n: sorted(fresh().list_keys()), ["store.list_keys()"])
    if hasattr(dist.TCPStore, "barrier"):
        def barriers(notes):
            a, t = fresh(), fresh()
            a.barrier("b1", 1)
            th = threading.Thread(target=lambda: a.barrier("b2", 2), daemon=True)
            th.start()
            time.sleep(0.5)  # lets the first barrier block; the capture shows it did
            t.barrier("b2", 2)
            th.join(10)
            return [a.get("b1"), a.get("b2")]
        rec.run("barrier", "barrier('b1', 1) returns at once; barrier('b2', 2) blocks the first "
                "client until a second client (new connection) arrives; the counters read back "
                "as decimal text.", "real-client", barriers,
                ["store.barrier('b1', 1)", "store.barrier('b2', 2)  # in a thread",
                 "other.barrier('b2', 2)", "store.get('b1')", "store.get('b2')"])

    def prefix(notes):
        p = dist.PrefixStore("default_pg", s)
        p.set("x", b"y")
        dist.PrefixStore("0", p).set("rank_0", b"addr")
        return p.get("x")
    rec.run("prefix_store", "PrefixStore prepends '<prefix>/' on the client side.",
            "real-client", prefix,
            ["PrefixStore('default_pg', store).set('x', b'y')",
             "PrefixStore('0', PrefixStore('default_pg', store)).set('rank_0', b'addr')",
             "PrefixStore('default_pg', store).get('x')"])

    def add_non_numeric(notes):
        e = dist.TCPStore(LOOPBACK, proxy.port, None, False, TD(seconds=5))
        holder["e"] = e
        e.set("text", b"abc")
        return e.add("text", 1)
    rec.run("add_on_non_numeric_value", "ADD on a key whose value is not decimal text: the "
            "server's integer parse throws and it drops the connection.", "real-client",
            add_non_numeric, ["store = TCPStore(...)", "store.set('text', b'abc')",
                              "store.add('text', 1)"])

    def raw(payload, want, timeout=3.0):
        def body(notes):
            c = raw_client(proxy.port)
            c.sendall(payload)
            a, st = recv_some(c, want, timeout)
            c.close()
            return (a.hex(), st)
        return body

    rec.run("pipelined_raw", "Handshake + SET + GETNUMKEYS + ADD in one send(): handled in "
            "order.", "synthetic-client",
            raw(hello() + q("SET") + enc_str(b"/pipe") + enc_str(b"p") + q("GETNUMKEYS") +
                q("ADD") + enc_str(b"/pipe_ctr") + struct.pack("<q", 7), 16),
            ["raw: SET '/pipe' | GETNUMKEYS | ADD '/pipe_ctr' 7"])
    rec.run("get_missing_raw", "GET of a missing key without a preceding WAIT (the real client "
            "never does this). Legacy servers throw and close; libuv answers an empty value.",
            "synthetic-client", raw(hello() + q("GET") + enc_str(b"/no_such_key"), 8),
            ["raw: GET '/no_such_key'"])
    rec.run("unknown_query_type_raw", "Query type 99 (unknown to every version): the server "
            "closes the connection.", "synthetic-client",
            raw(hello() + bytes([99]) + enc_str(b"k") + enc_str(b"v"), 1),
            ["raw: 0x63 + string + string"])
    if "CANCEL_WAIT" in QNUM:
        rec.run("cancel_wait_without_wait_raw", "CANCEL_WAIT with no WAIT pending: answered "
                "WAIT_CANCELED (1) anyway.", "synthetic-client",
                raw(hello() + q("CANCEL_WAIT"), 1), ["raw: CANCEL_WAIT"])
    if v2:
        rec.run("wrong_magic_raw", "VALIDATE with a wrong magic, then GETNUMKEYS: what the "
                "server does with a client that fails validation.", "synthetic-client",
                raw(q("VALIDATE") + struct.pack("<I", 0xDEADBEEF) + q("GETNUMKEYS"), 8, 2.0),
                ["raw: VALIDATE 0xDEADBEEF | GETNUMKEYS"])
        rec.run("no_validate_raw", "A first request without VALIDATE (what a 1.13/2.0/2.1 client "
                "sends: ADD 'init/' 1 in their numbering, type 3 = GET here).",
                "synthetic-client",
                raw(bytes([3]) + enc_str(b"init/") + struct.pack("<q", 1), 8, 2.0),
                ["raw: 03 + 'init/' + i64 1  (old-numbering ADD)"])
    else:
        rec.run("v2_validate_ping_against_this_server", "What a torch >= 2.5 client sends first "
                "(VALIDATE 00 + magic, PING 0d + nonce 4242) sent to this older server.",
                "synthetic-client",
                raw(bytes([0]) + struct.pack("<I", VALIDATION_MAGIC) + bytes([13]) +
                    struct.pack("<I", 4242), 4, 2.0),
                ["raw: 00 ce f7 85 3c | 0d 92 10 00 00"])

    scenarios.extend(rec.scenarios)
    proxy.stop()
    srv.kill()
    return srv_port


def capture_init(kind, workdir, scenarios):
    """The two init_process_group scenarios, each with its own proxy (and server)."""
    common = {"MASTER_ADDR": LOOPBACK, "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo",
              "USE_LIBUV": "1" if kind == "libuv" else "0"}

    def record(name, desc, calls, make_envs, host_server, infer):
        sp, spp = start_server(0, kind) if host_server else (None, free_port())
        p2 = Proxy(spp, os.path.join(workdir, kind + "-" + name + ".log"))
        r2 = Recorder(p2, kind)
        envs = make_envs(spp, p2.port)
        r2.run(name, desc, "real-client", lambda n: run_workers(envs), calls, settle=1.0,
               infer_peer=infer)
        scenarios.extend(r2.scenarios)
        p2.stop()
        if sp:
            sp.kill()

    if not (DIALECT == "2.1" and kind == "libuv"):  # 2.1's init_process_group has no libuv
        record(
            "init_process_group_env_rank1",
            "Two processes run init_process_group('gloo', init_method='env://') with "
            "WORLD_SIZE=2, then all_reduce, barrier, destroy_process_group. Rank 0 hosts the "
            "TCPStore server (multi_tenant, USE_LIBUV per `server`) on its own MASTER_PORT; "
            "rank 1 is given the proxy's port, so this is rank 1's complete store traffic. "
            "Rank 0's own store requests are not seen; hidden_actions infers them from rank 1's "
            "replies (a key rank 1 waits for appears with the value rank 1 later reads; an ADD "
            "reply larger than rank 1's adds explain was preceded by rank 0's ADD).",
            ["init_process_group('gloo', init_method='env://')", "all_reduce", "barrier",
             "destroy_process_group()"],
            lambda sp, pp: [dict(common, RANK="0", MASTER_PORT=str(sp)),
                            dict(common, RANK="1", MASTER_PORT=str(pp))],
            host_server=False, infer="rank 0 (inferred from rank 1's replies)")
    record(
        "init_process_group_env_agent_store_both_ranks",
        "Same with TORCHELASTIC_USE_AGENT_STORE=True and TORCHELASTIC_RESTART_COUNT=0: no rank "
        "hosts a server (the script hosts one, as the agent would), both ranks are clients "
        "through the proxy (connection numbers interleave between the two processes).",
        ["TORCHELASTIC_USE_AGENT_STORE=True", "init_process_group('gloo', init_method='env://')",
         "all_reduce", "barrier", "destroy_process_group"],
        lambda sp, pp: [dict(common, RANK=str(r), MASTER_PORT=str(pp),
                             TORCHELASTIC_USE_AGENT_STORE="True",
                             TORCHELASTIC_RESTART_COUNT="0") for r in (0, 1)],
        host_server=True, infer=None)


def main():
    out_path = sys.argv[1]
    import torch
    set_dialect(dialect_of(torch.__version__))
    kinds = ["1.13"] if DIALECT == "1.13" else ["libuv", "legacy"]
    workdir = tempfile.mkdtemp(prefix="tcpstore-capture-")
    scenarios, servers = [], []
    for kind in kinds:
        try:
            start_server(0, kind)[0].kill()
        except Exception as e:  # e.g. a torch built without libuv
            print("skipping the %s server: %s" % (kind, e), flush=True)
            continue
        servers.append(kind)
        capture_server(kind, workdir, scenarios)
        capture_init(kind, workdir, scenarios)
    doc = {
        "format": "tcpstore-wire-capture v2",
        "torch_version": torch.__version__,
        "torch_build": "PyPI wheel %s (%s)" % (torch.__version__, sys.executable),
        "host_byte_order": sys.byteorder,
        "dialect": DIALECT,
        "numbering": "torch %s QueryType: " % DIALECT + " ".join(
            "%s=%d" % (n, i) for i, n in enumerate(NUMBERINGS[DIALECT])),
        "servers": servers,
        "how": "tests/torch/capture_tcpstore.py; see tests/rendezvous/data/README.md",
        "schema": "scenarios[]: {name, server, kind, description, api_calls[], notes[], "
                  "hidden_actions[]?, exchanges[]}; exchanges[]: {name, direction "
                  "('client->server'|'server->client'|'event'), conn (connection number "
                  "within the scenario's proxy; one proxy per server for the non-init "
                  "scenarios), t_ms, hex, decoded}; hidden_actions[]: {before (exchange index), "
                  "op (set|add|delete_key|queue_push), key (wire key), value_hex | delta, by}",
        "scenarios": scenarios,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", out_path, len(scenarios), "scenarios", flush=True)
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--proxy":
        proxy_main(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 2:
        main()
    else:
        sys.exit(__doc__)
