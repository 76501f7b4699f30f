"""Shared by the chat transport tests: a guard against traffic beyond loopback, and a
transport running in a thread as the cockpit runs it."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kagura_agent.cockpit.transport import Event, Transport


def loopback_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any name lookup other than 127.0.0.1 fails, and fails the test afterwards too
    (so a default slack.com or discord.com URL left anywhere is caught)."""
    elsewhere: list[object] = []
    resolve = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", b"127.0.0.1"):
            elsewhere.append(host)
            raise OSError(f"test guard: no traffic beyond 127.0.0.1 (asked for {host!r})")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield
    assert elsewhere == []


class RunningTransport:
    """``transport.run`` in a thread, its events in a queue; ready once ``connected()``."""

    def __init__(
        self, transport: Transport, connected: Callable[[], None], handle: Any = None
    ) -> None:
        self.transport = transport
        self.events: queue.Queue[Event] = queue.Queue()
        self.error: BaseException | None = None
        self._handle = handle or self.events.put
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        connected()

    def _run(self) -> None:
        try:
            self.transport.run(self._handle)
        except BaseException as exc:
            self.error = exc

    def next_event(self) -> Event:
        return self.events.get(timeout=5)

    def stop(self) -> float:
        """Stop the transport; return how long run() took to return."""
        started = time.monotonic()
        self.transport.stop()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "run() did not return after stop()"
        assert self.error is None
        return time.monotonic() - started
