"""Drives a TCPStore server through every operation torch 2.x's Python TCPStore client exposes.

Run by tests/rendezvous/torch2_interop_test.cc with the pinned torch 2.x interpreter
(CPPRUN_TORCH2_PYTHON), against cpprun-store or, as a worker under `cpprun`, the agent's store:

    python tests/torch/store_client_ops_v2.py (--port P [--host H] | --from-env)
                                              [--harness-wakes] [--harness-done]

--from-env reads MASTER_ADDR / MASTER_PORT as a worker does. The server may hold keys of its own
(the agent's): counts and key lists are checked relative to what was there at the start, and
user keys carry the "/" prefix the Python TCPStore adds, so they cannot collide with them.

Every result is checked here; the first mismatch prints "FAIL <what>" and exits 1. Lines the
harness may wait for, in this order:

    STORE <host>:<port> BASE <n>  connected; the server held n keys
    BLOCKED_ON /interop_wakeup    a second store object is blocked in get("interop_wakeup").
                                  With --harness-wakes the harness sets "/interop_wakeup" to
                                  b"from-cpprun"; without it a third store object here sets
                                  b"from-peer" (the get may or may not block first then).
    KEYS <n>                      the server's key count after the last write
    OK <n> checks                 everything passed
    DONE                          with --harness-done: after the harness set "/harness_done"
                                  (it can read the store first); always the last line.
"""

import argparse
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STORE_TIMEOUT = timedelta(seconds=30)
SHORT = timedelta(milliseconds=300)

checks = 0


def fail(message):
    print(f"FAIL {message}", flush=True)
    sys.exit(1)


def check(what, got, expected):
    global checks
    if got != expected:
        fail(f"{what}: got {got!r}, expected {expected!r}")
    checks += 1


def check_raises(what, call, error, at_least_s=0.0):
    """`call` must raise `error`, and not before `at_least_s` (nor much after it)."""
    global checks
    start = time.monotonic()
    try:
        call()
    except error as e:
        elapsed = time.monotonic() - start
        if not at_least_s * 0.8 <= elapsed < at_least_s + 10:
            fail(f"{what}: raised after {elapsed:.2f} s, expected about {at_least_s} s ({e})")
        checks += 1
        return str(e)
    fail(f"{what}: returned instead of raising {error.__name__}")


def run_in_thread(call):
    """Starts `call` on a thread; returns (thread, result dict with "value" or "error")."""
    result = {}

    def body():
        try:
            result["value"] = call()
        except Exception as e:  # reported through the dict, checked by the caller
            result["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, result


def joined(what, thread, result, timeout_s):
    thread.join(timeout=timeout_s)
    check(f"{what}: finished", thread.is_alive(), False)
    check(f"{what}: error", result.get("error"), None)
    return result.get("value")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    parser.add_argument("--from-env", action="store_true",
                        help="connect to MASTER_ADDR:MASTER_PORT, as a worker does")
    parser.add_argument("--harness-wakes", action="store_true",
                        help="the harness sets /interop_wakeup once the blocking get waits")
    parser.add_argument("--harness-done", action="store_true",
                        help="wait for the harness to set /harness_done before exiting")
    parser.add_argument("--no-barrier", action="store_true",
                        help="for a torch whose TCPStore has no barrier() (2.11 has none): leave "
                        "out the BARRIER checks and say so; without this flag a missing barrier fails")
    args = parser.parse_args()
    if args.from_env:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    elif args.port is None:
        parser.error("--port or --from-env is required")
    else:
        host, port = args.host, args.port

    def connect(world_size=None, timeout=STORE_TIMEOUT):
        return dist.TCPStore(host, port, world_size, False, timeout)

    store = connect()
    base_keys = store.num_keys()
    base_list = set(store.list_keys())
    print(f"STORE {host}:{port} BASE {base_keys}", flush=True)
    check("torch version", torch.__version__.split(".")[0], "2")
    check("store.host", store.host, host)
    check("store.port", store.port, port)
    check("store.timeout", store.timeout, STORE_TIMEOUT)
    # A client object reports the backend it asked for (use_libuv defaults to True) and the
    # extended API (append, multi_*, queues, list_keys, barrier) that TCPStore always has.
    check("libuvBackend", store.libuvBackend, True)
    check("has_extended_api", store.has_extended_api(), True)
    # With a world size a non-master client adds 1 to the server's "init/" counter and does
    # not wait (only the store hosting the server waits for the others).
    peer = connect(world_size=2)
    init_key = store.num_keys() - base_keys  # 1 when this made "init/", 0 if it was there
    check("init/ counted once at most", init_key in (0, 1), True)

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

    # check.
    check("check present", store.check(["bytes_key", "counter"]), True)
    check("check one missing", store.check(["bytes_key", "cas_missing"]), False)
    check("check no keys", store.check([]), True)

    # wait on keys that exist: returns at once.
    check("wait ready", store.wait(["bytes_key", "counter", "empty_key"]), None)
    check("wait ready, explicit timeout", store.wait(["cas_new"], timedelta(seconds=5)), None)
    check("wait no keys", store.wait([]), None)

    # wait that times out: torch 2.x sends CANCEL_WAIT and reads the server's answer, so the
    # same connection must keep working afterwards (no stray reply read as the next answer).
    message = check_raises("wait for a key never set",
                           lambda: store.wait(["cas_missing"], SHORT), dist.DistStoreError, 0.3)
    check("wait timeout message names the key", "/cas_missing" in message, True)
    check("same connection after wait timeout", store.get("bytes_key"), b"value-2")
    check("num_keys after wait timeout", store.num_keys() - base_keys, 7 + init_key)
    # Several timeouts in a row on one connection, then a normal wait on it.
    for i in range(3):
        check_raises(f"wait timeout #{i}", lambda: store.wait(["never", "counter"], SHORT),
                     dist.DistStoreError, 0.3)
    check("counter after timeouts", store.add("counter", 0), 13)

    # A wait on two keys, one present, woken when another client sets the other.
    waiter = connect()
    thread, result = run_in_thread(lambda: waiter.wait(["counter", "late_key"],
                                                       timedelta(seconds=20)))
    peer.set("late_key", b"late")
    check("wait woken by another client", joined("wait woken", thread, result, 25), None)
    check("waiter connection still fine", waiter.get("late_key"), b"late")

    # A get that blocks until another client sets the key. Its own store object: one connection
    # must not carry two requests at once. torch releases the GIL while it blocks.
    thread, result = run_in_thread(lambda: waiter.get("interop_wakeup"))
    print("BLOCKED_ON /interop_wakeup", flush=True)
    if not args.harness_wakes:
        peer.set("interop_wakeup", b"from-peer")
    expected_wakeup = b"from-cpprun" if args.harness_wakes else b"from-peer"
    check("blocking get value", joined("blocking get", thread, result, 35), expected_wakeup)

    # set_timeout: the store timeout bounds get()'s wait; the connection survives it.
    doomed = connect()
    doomed.set_timeout(timedelta(milliseconds=400))
    check("timeout after set_timeout", doomed.timeout, timedelta(milliseconds=400))
    check_raises("get with the store timeout", lambda: doomed.get("never_set"),
                 dist.DistStoreError, 0.4)
    check("connection after get timeout", doomed.get("counter"), b"13")

    # clone: a new connection to the same server with the same timeout, usable concurrently.
    twin = store.clone()
    check("clone timeout", twin.timeout, STORE_TIMEOUT)
    check("clone reads", twin.get("cas_new"), b"second")
    thread, result = run_in_thread(lambda: twin.get("clone_wakeup"))
    store.set("clone_wakeup", b"cloned")
    check("clone blocked get", joined("clone get", thread, result, 35), b"cloned")

    # delete_key and num_keys (num_keys counts every key on the server, other clients' too).
    user_keys = 11  # the 7 above, late_key, interop_wakeup, clone_wakeup, to_delete
    check("num_keys", store.num_keys() - base_keys, user_keys - 1 + init_key)
    store.set("to_delete", b"x")
    check("num_keys after set", store.num_keys() - base_keys, user_keys + init_key)
    check("delete existing", store.delete_key("to_delete"), True)
    check("delete missing", store.delete_key("to_delete"), False)
    check("check deleted", store.check(["to_delete"]), False)
    check("num_keys after delete", store.num_keys() - base_keys, user_keys - 1 + init_key)

    # append: creates, then concatenates; wakes waiters like a set.
    store.append("log", b"a")
    store.append("log", "bc")
    store.append("log", b"")
    check("append", store.get("log"), b"abc")
    thread, result = run_in_thread(lambda: waiter.get("appended_later"))
    peer.append("appended_later", b"x")
    check("append wakes a get", joined("append wake", thread, result, 35), b"x")

    # multi_set / multi_get (in request order; multi_get waits for missing keys first).
    store.multi_set(["m1", "m2", "m3"], [b"one", b"", binary])
    check("multi_get", store.multi_get(["m3", "m1", "m2", "bytes_key"]),
          [binary, b"one", b"", b"value-2"])
    check("multi_get none", store.multi_get([]), [])
    thread, result = run_in_thread(lambda: waiter.multi_get(["m1", "multi_later"]))
    peer.multi_set(["multi_later"], [b"ml"])
    check("multi_get waits", joined("multi_get wait", thread, result, 35), [b"one", b"ml"])
    check_raises("multi_get times out", lambda: doomed.multi_get(["m1", "never_set"]),
                 dist.DistStoreError, 0.4)

    # Queues (libuv-server operations; cpprun's server has them).
    check("queue_len missing", store.queue_len("jobs"), 0)
    store.queue_push("jobs", b"j1")
    store.queue_push("jobs", "j2")
    check("queue_len", store.queue_len("jobs"), 2)
    check("check sees a non-empty queue", store.check(["jobs"]), True)
    check("queue_pop blocking, item there", store.queue_pop("jobs"), b"j1")
    check("queue_pop non-blocking", store.queue_pop("jobs", block=False), b"j2")
    check("queue_len empty", store.queue_len("jobs"), 0)
    check_raises("queue_pop non-blocking on empty", lambda: store.queue_pop("jobs", block=False),
                 dist.QueueEmptyError)
    check_raises("queue_pop blocking times out", lambda: doomed.queue_pop("jobs"),
                 dist.DistStoreError, 0.4)
    check("connection after queue timeout", doomed.queue_len("jobs"), 0)
    thread, result = run_in_thread(lambda: waiter.queue_pop("jobs"))
    peer.queue_push("jobs", b"j3")
    check("blocking queue_pop woken by a push", joined("queue_pop", thread, result, 35), b"j3")
    check("queue_len after pops", store.queue_len("jobs"), 0)

    # barrier (the BARRIER request): two store objects meet; then one alone times out.
    if args.no_barrier:
        print(f"SKIPPED barrier checks: --no-barrier (torch {torch.__version__}, TCPStore.barrier "
              f"{'present' if hasattr(store, 'barrier') else 'absent'})", flush=True)
    else:
        thread, result = run_in_thread(lambda: waiter.barrier("meet", 2, timedelta(seconds=20)))
        check("barrier second arrival", peer.barrier("meet", 2, timedelta(seconds=20)), None)
        check("barrier first arrival", joined("barrier", thread, result, 25), None)
        check("barrier counter", store.get("meet"), b"2")
        check("barrier of one", store.barrier("solo", 1), None)
        check_raises("barrier times out", lambda: doomed.barrier("lonely", 2, SHORT),
                     dist.DistStoreError, 0.3)
        check("connection after barrier timeout", doomed.get("meet"), b"2")

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
    check("prefix check", pg.check(["x", "n"]), True)
    check("prefix wait", pg.wait(["x", "n"]), None)
    pg.append("x", b"!")
    check("prefix append", pg.get("x"), b"z!")
    pg.multi_set(["p1", "p2"], [b"1", b"2"])
    check("prefix multi_get", pg.multi_get(["p2", "p1"]), [b"2", b"1"])
    check("prefix list_keys", sorted(pg.list_keys()), ["0/rank_0", "n", "p1", "p2", "x"])
    check("prefix delete", pg.delete_key("n"), True)
    pg.queue_push("pq", b"q")
    check("prefix queue_len", pg.queue_len("pq"), 1)
    check("prefix queue_pop", pg.queue_pop("pq", False), b"q")
    # PrefixStore's barrier is the generic one: an add and a wait on "<key>/..." keys.
    if not args.no_barrier:
        check("prefix barrier of one", pg.barrier("pb", 1), None)
    message = check_raises("prefix wait timeout", lambda: pg.wait(["never"], SHORT),
                           dist.DistStoreError, 0.3)
    check("prefix wait timeout names the full key", "/default_pg/never" in message, True)

    store.set("interop_final", b"interop-ok")
    check("final key", peer.get("interop_final"), b"interop-ok")

    # list_keys: this client's keys (the "/" prefix stripped), queues not included.
    expected = {"bytes_key", "str_key", "empty_key", "binary_key", "large_key", "counter",
                "cas_new", "late_key", "interop_wakeup", "clone_wakeup", "log",
                "appended_later", "m1", "m2", "m3", "multi_later", "meet", "solo", "lonely",
                "default_pg/x", "default_pg/0/rank_0", "default_pg/p1", "default_pg/p2",
                "default_pg/pb/num_members", "default_pg/pb/last_member", "interop_final"}
    if args.no_barrier:
        expected -= {"meet", "solo", "lonely", "default_pg/pb/num_members", "default_pg/pb/last_member"}
    listed = set(store.list_keys())
    check("list_keys", sorted(listed - base_list), sorted(expected))
    keys = store.num_keys()
    # Every listed user key ("lonely" too: its counter stays after the timed-out barrier, as on
    # torch's server), plus "init/" when this test made it.
    check("num_keys at the end", keys - base_keys, len(expected) + init_key)
    print(f"KEYS {keys}", flush=True)
    print(f"OK {checks} checks", flush=True)
    if args.harness_done:
        store.wait(["harness_done"], timedelta(seconds=60))
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
