#!/usr/bin/python3
"""The peer server of store_bench: PyTorch's own TCPStore server, on 127.0.0.1.

Starts torch.distributed.TCPStore("127.0.0.1", 0, None, True) (the kernel picks the port; no
world size, so the constructor does not wait for workers), prints "PORT <n>" on stdout, then
serves until stdin closes or SIGTERM/SIGINT arrives. With Debian's torch 1.13 this is the
"legacy" server: one thread, poll() over every socket, blocking reads per request.

Run it with /usr/bin/python3 (the interpreter Debian's torch is installed for).
"""

import os
import resource
import signal
import sys
import threading


def raise_open_file_limit():
    # A storm of thousands of clients needs one descriptor per connection in the server.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            print(f"torch_store_server: cannot raise RLIMIT_NOFILE: {e}", file=sys.stderr)


def main():
    raise_open_file_limit()
    stop = threading.Event()

    def on_signal(signo, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True)
    print(f"PORT {store.port}", flush=True)

    # Reads stdin on a helper thread so the main thread stays free to run signal handlers.
    def watch_stdin():
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.5):
        pass
    # The server thread belongs to `store`; the process exits without joining it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
