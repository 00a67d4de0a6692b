#!/usr/bin/python3
"""The peer server of store_bench: PyTorch's own TCPStore server, on 127.0.0.1.

    PYTHON torch_store_server.py [--backend default|libuv|legacy] [--listen default|ipv4]

Starts torch.distributed.TCPStore("127.0.0.1", 0, None, True) (the kernel picks the port; no
world size, so the constructor does not wait for workers), prints "PORT <n>" and then
"BACKEND <libuv|legacy>" on stdout, then serves until stdin closes or SIGTERM/SIGINT arrives.

- Debian's torch 1.13 (/usr/bin/python3): the "legacy" server only (one thread, poll() over
  every socket, blocking reads per request); --backend must be default or legacy.
- torch 2.x (the venv's python): --backend libuv passes use_libuv=True (the default since 2.4:
  one libuv event loop thread), --backend legacy use_libuv=False; default passes nothing.
- --listen ipv4 (torch 2.x): the script binds and listens on 127.0.0.1 itself (backlog 4096)
  and hands the socket over as master_listen_fd. By default TCPStore binds a dual-stack IPv6
  socket, so every client shows up as ::ffff:127.0.0.1, which /etc/hosts does not name; the
  libuv server asks DNS for each accepted peer's name (getnameinfo, synchronously, on its only
  loop thread), and behind a resolver that drops bursts every such lookup can take 5 s. With an
  IPv4 socket the peer is 127.0.0.1 and the name comes from /etc/hosts.
"""

import argparse
import os
import socket
import resource
import signal
import sys
import threading
import time


def raise_open_file_limit():
    # A storm of thousands of clients needs one descriptor per connection in the server.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            print(f"torch_store_server: cannot raise RLIMIT_NOFILE: {e}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--backend", choices=["default", "libuv", "legacy"], default="default")
    parser.add_argument("--listen", choices=["default", "ipv4"], default="default")
    args = parser.parse_args()
    raise_open_file_limit()
    # A list, not a threading.Event: a handler that calls Event.set() deadlocks when the signal
    # lands while the main thread holds the event's lock inside Event.wait.
    stopping = []

    def on_signal(signo, frame):
        stopping.append(signo)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    import torch.distributed as dist

    kwargs = {}
    if args.backend != "default":
        kwargs["use_libuv"] = args.backend == "libuv"
    port = 0
    if args.listen == "ipv4":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        port = listener.getsockname()[1]
        kwargs["master_listen_fd"] = listener.fileno()
    try:
        store = dist.TCPStore("127.0.0.1", port, None, True, **kwargs)
    except TypeError as e:  # torch 1.13 has neither use_libuv nor master_listen_fd
        print(f"torch_store_server: --backend {args.backend}: {e}", file=sys.stderr)
        sys.exit(2)
    # torch >= 2.2 says which server it runs; torch 1.13 has only the legacy one.
    backend = "libuv" if getattr(store, "libuvBackend", False) else "legacy"
    if args.backend != "default" and backend != args.backend:
        print(f"torch_store_server: asked for {args.backend}, got {backend}", file=sys.stderr)
        sys.exit(2)
    print(f"PORT {store.port}", flush=True)
    print(f"BACKEND {backend}", flush=True)

    # Reads stdin on a helper thread so the main thread stays free to run signal handlers.
    def watch_stdin():
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        stopping.append(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stopping:
        time.sleep(0.1)
    # The server thread belongs to `store`; the process exits without joining it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
