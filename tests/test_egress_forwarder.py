"""The in-container forwarder without Docker: TCP on loopback -> a Unix socket, byte for byte.

More connections at once than the forwarder relays on threads of its own
(``THREADED_MAX``), so both of its paths carry data: the poll-and-splice thread and the
event loop. Each connection sends a body, half-closes, and must read back exactly the
echo; the echo server only answers after the client's end of file, so half-close has to
pass through too.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.membrane.egress import forwarder


def _echo_server(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)

    def handle(conn: socket.socket) -> None:
        with conn:
            body = bytearray()
            while chunk := conn.recv(65536):
                body += chunk
            conn.sendall(bytes(body))

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


def _start_forwarder(path: str) -> int:
    server = forwarder.listen(0)
    port = int(server.getsockname()[1])

    def run() -> None:
        asyncio.run(forwarder.serve(server, path))

    threading.Thread(target=run, daemon=True).start()
    return port


class _NoSecondThread(threading.Thread):
    """As if the pids limit were reached: a relay's second thread cannot start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refuse = kwargs.get("target") is forwarder._pump_blocking

    def start(self) -> None:
        if self._refuse:
            raise RuntimeError("can't start new thread")
        super().start()


@pytest.mark.parametrize("second_thread", ["available", "refused"])
def test_many_connections_relay_intact_with_half_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second_thread: str
) -> None:
    if second_thread == "refused":  # the one thread polls both directions
        monkeypatch.setattr(forwarder.threading, "Thread", _NoSecondThread)
    path = str(tmp_path / "proxy.sock")
    echo = _echo_server(path)
    port = _start_forwarder(path)
    count = forwarder.THREADED_MAX + 6
    results: dict[int, str] = {}

    def client(i: int) -> None:
        body = bytes([i]) * (1_500_000 + i * 7919)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            sender = threading.Thread(
                target=lambda: (conn.sendall(body), conn.shutdown(socket.SHUT_WR))
            )
            sender.start()
            got = bytearray()
            while chunk := conn.recv(65536):
                got += chunk
            sender.join()
        ok = hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
        results[i] = "ok" if ok else f"{len(got)} of {len(body)} bytes"

    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    echo.close()
    assert results == {i: "ok" for i in range(count)}


def test_a_connection_to_a_dead_proxy_is_closed(tmp_path: Path) -> None:
    port = _start_forwarder(str(tmp_path / "nobody.sock"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        assert conn.recv(1) == b""
