"""Make a loopback TCP port of this machine answer on a network namespace's loopback too.

    python3 scripts/netns-forward.py NETNS_PATH PORT

The listening socket is made inside the namespace (``setns`` into it, bind, back again:
a socket stays in the namespace it was made in); every connection accepted there is
copied to 127.0.0.1:PORT of the namespace this process runs in. scripts/dockerd2-up.sh
uses it so the second daemon, in a network namespace of its own, pulls from the loopback
registry under the same 127.0.0.1:PORT name the first daemon pushed to (the name is in
the plans, ``image.pull``). No other way in or out of that namespace is opened.
Prints ``ready`` once it listens; runs until killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def listen_in(netns: str, port: int) -> socket.socket:
    """A listener on 127.0.0.1:PORT inside ``netns``; this thread returns to its own."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            return socket.create_server(("127.0.0.1", port), backlog=64)
        finally:
            _setns(home)
    finally:
        os.close(home)
        os.close(target)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    netns, port = argv[0], int(argv[1])
    server = listen_in(netns, port)
    print("ready", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve, args=(client, port), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
