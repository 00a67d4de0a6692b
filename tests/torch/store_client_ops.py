"""Drives a TCPStore server through every operation torch 1.13's Python TCPStore client exposes.

Run by tests/rendezvous/torch_interop_test.cc against cpprun's own server, always with Debian's
/usr/bin/python3 (the interpreter that has torch):

    /usr/bin/python3 tests/torch/store_client_ops.py --port P [--host H] [--harness-wakes]

Every result is checked here; the first mismatch prints "FAIL <what>" and exits 1. Progress
lines the harness may wait for:

    BLOCKED_ON /interop_wakeup   a second store object is blocked in get("interop_wakeup").
                                 With --harness-wakes the harness sets "/interop_wakeup" to
                                 b"from-cpprun"; without it this script sets b"from-peer" from
                                 another store object (then the get may or may not block first).
    KEYS <n>                     the server's key count after the last write
    OK <n> checks                everything passed (always the last line)

The last write is "interop_final" = b"interop-ok" ("/interop_final" on the wire: the Python
TCPStore prefixes user keys with "/").
"""

import argparse
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

STORE_TIMEOUT = timedelta(seconds=30)

checks = 0


def fail(message):
    print(f"FAIL {message}", flush=True)
    sys.exit(1)


def check(what, got, expected):
    global checks
    if got != expected:
        fail(f"{what}: got {got!r}, expected {expected!r}")
    checks += 1


def check_times_out(what, call, at_least_s):
    """`call` must raise RuntimeError (torch 1.13's timeout error) after roughly its timeout."""
    global checks
    start = time.monotonic()
    try:
        call()
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        if not at_least_s * 0.8 <= elapsed < at_least_s + 10:
            fail(f"{what}: timed out after {elapsed:.2f} s, expected about {at_least_s} s ({e})")
        checks += 1
        return
    fail(f"{what}: returned instead of timing out")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--harness-wakes", action="store_true",
                        help="the harness sets /interop_wakeup once the blocking get waits")
    args = parser.parse_args()
    host, port = args.host, args.port

    def connect(world_size=None):
        return dist.TCPStore(host, port, world_size, False, STORE_TIMEOUT)

    store = connect()
    check("store.host", store.host, host)
    check("store.port", store.port, port)
    check("store.timeout", store.timeout, STORE_TIMEOUT)
    # With a world size a non-master client adds 1 to the server's "init/" counter (and does
    # not wait: only the store hosting the server waits for the others).
    peer = connect(world_size=2)

    # set / get, every kind of value.
    store.set("bytes_key", b"value-1")
    check("get bytes", store.get("bytes_key"), b"value-1")
    store.set("bytes_key", b"value-2")
    check("get overwritten", store.get("bytes_key"), b"value-2")
    check("get from another client", peer.get("bytes_key"), b"value-2")
    store.set("str_key", "h\u00e9llo")
    check("get str (utf-8)", store.get("str_key"), "h\u00e9llo".encode())
    store.set("empty_key", b"")
    check("get empty", store.get("empty_key"), b"")
    binary = bytes(range(256))
    store.set("binary_key", binary)
    check("get binary", store.get("binary_key"), binary)
    large = bytes((i * 7 + 3) % 256 for i in range(3 * 1024))
    store.set("large_key", large)
    check("get 3 KiB", store.get("large_key"), large)

    # add: a decimal counter created at 0.
    check("add 5", store.add("counter", 5), 5)
    check("add -2", store.add("counter", -2), 3)
    check("add 0", store.add("counter", 0), 3)
    check("counter is decimal text", store.get("counter"), b"3")
    check("add from another client", peer.add("counter", 10), 13)

    # compare_set, the four cases.
    check("cas missing key, expected empty", store.compare_set("cas_new", "", "first"), b"first")
    check("cas missing key, expected non-empty", store.compare_set("cas_missing", "x", "y"), b"x")
    check("cas match", store.compare_set("cas_new", "first", "second"), b"second")
    check("cas mismatch", store.compare_set("cas_new", "nomatch", "third"), b"second")
    check("get after cas", store.get("cas_new"), b"second")

    # wait on keys that exist: returns at once.
    check("wait ready", store.wait(["bytes_key", "counter", "empty_key"]), None)
    check("wait ready, explicit timeout", store.wait(["cas_new"], timedelta(seconds=5)), None)
    check("wait no keys", store.wait([]), None)

    # A get that blocks until another client sets the key. Its own store object: one connection
    # must not carry two requests at once. torch releases the GIL while it blocks.
    waiter = connect()
    result = {}

    def blocking_get():
        try:
            result["value"] = waiter.get("interop_wakeup")
        except RuntimeError as e:
            result["error"] = str(e)

    getter = threading.Thread(target=blocking_get, daemon=True)
    getter.start()
    print("BLOCKED_ON /interop_wakeup", flush=True)
    if not args.harness_wakes:
        peer.set("interop_wakeup", b"from-peer")
    getter.join(timeout=STORE_TIMEOUT.total_seconds() + 5)
    check("blocking get returned", getter.is_alive(), False)
    check("blocking get error", result.get("error"), None)
    expected_wakeup = b"from-cpprun" if args.harness_wakes else b"from-peer"
    check("blocking get value", result.get("value"), expected_wakeup)
    del waiter

    # Timeouts, on a store object of their own: a torch 1.13 client that timed out leaves its
    # wait registered on the server and would misread a later wake-up as its next reply.
    doomed = connect()
    check_times_out("wait for a key never set", lambda: doomed.wait(["cas_missing"],
                                                                    timedelta(milliseconds=300)),
                    0.3)
    doomed.set_timeout(timedelta(milliseconds=400))
    check("timeout after set_timeout", doomed.timeout, timedelta(milliseconds=400))
    check_times_out("get with the store timeout", lambda: doomed.get("never_set"), 0.4)
    del doomed
    store.set_timeout(timedelta(seconds=20))
    check("set_timeout", store.timeout, timedelta(seconds=20))

    # num_keys counts every key on the server: the 7 user keys above, "/interop_wakeup" and
    # the "init/" counter ("/cas_missing" must not exist).
    check("num_keys", store.num_keys(), 9)

    # delete_key.
    store.set("to_delete", b"x")
    check("num_keys after set", store.num_keys(), 10)
    check("delete existing", store.delete_key("to_delete"), True)
    check("delete missing", store.delete_key("to_delete"), False)
    check("num_keys after delete", store.num_keys(), 9)

    # PrefixStore, as init_process_group uses it: "<prefix>/" before every key, on the client.
    pg = dist.PrefixStore("default_pg", store)
    pg.set("x", b"y")
    check("prefix get", pg.get("x"), b"y")
    check("prefix key seen unprefixed", store.get("default_pg/x"), b"y")
    group = dist.PrefixStore("0", pg)
    group.set("rank_0", b"addr")
    check("nested prefix key", store.get("default_pg/0/rank_0"), b"addr")
    check("prefix add", pg.add("n", 2), 2)
    check("prefix cas", pg.compare_set("x", "y", "z"), b"z")
    check("prefix wait", pg.wait(["x", "n"]), None)
    check("prefix num_keys counts everything", pg.num_keys(), 12)
    check("prefix delete", pg.delete_key("n"), True)

    store.set("interop_final", b"interop-ok")
    check("final key", peer.get("interop_final"), b"interop-ok")
    keys = store.num_keys()
    check("num_keys at the end", keys, 12)
    print(f"KEYS {keys}", flush=True)
    print(f"OK {checks} checks", flush=True)


if __name__ == "__main__":
    main()
