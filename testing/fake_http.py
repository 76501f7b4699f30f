"""A small JSON-over-HTTP server base for protocol-faithful fakes on 127.0.0.1.

Each fake registers routes ``(method, regex) -> handler(request) -> (status, body)``,
records what happened in ``events`` (readable in-process or at GET /_admin/events), and
accepts injected failures at POST /_admin/fail {"method", "path", "status", "count"} so
tests can drive transient and permanent errors through the real SDKs.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    match: re.Match[str]

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def bearer(self) -> str | None:
        value = self.headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        return token if scheme.lower() in ("bearer", "token") and token else None


@dataclass
class Raw:
    """A response body that is not JSON (a handler returns ``(status, Raw(...))``)."""

    content_type: str
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], tuple[int, Any]]


@dataclass
class Failure:
    method: str
    path: str
    status: int
    count: int


@dataclass
class FakeServer:
    """Routes + recorded events + failure injection, served from a daemon thread."""

    host: str = "127.0.0.1"
    port: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    _routes: list[tuple[str, re.Pattern[str], Handler]] = field(default_factory=list)
    _failures: list[Failure] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self._routes.append((method, re.compile(pattern + r"$"), handler))

    def record(self, op: str, **details: Any) -> None:
        with self._lock:
            self.events.append({"op": op, **details})

    def ops(self, op: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["op"] == op]

    def fail(self, method: str, path: str, status: int, count: int = 1) -> None:
        """Answer the next ``count`` requests matching method + path prefix with ``status``."""
        with self._lock:
            self._failures.append(Failure(method, path, status, count))

    def error_body(self, status: int) -> Any:
        """The body of an injected failure, in the faked API's error shape."""
        return {"message": f"injected failure {status}"}

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> FakeServer:
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read events, not access logs

            def _serve(self) -> None:
                fake._dispatch(self)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

        self._server = ThreadingHTTPServer((self.host, self.port), _Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _injected(self, method: str, path: str) -> int | None:
        with self._lock:
            for failure in self._failures:
                if failure.count > 0 and failure.method == method and path.startswith(failure.path):
                    failure.count -= 1
                    return failure.status
        return None

    def _dispatch(self, http: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(http.path)
        length = int(http.headers.get("content-length") or 0)
        body = http.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in http.headers.items()}
        method = http.command
        status: int
        payload: Any
        if parts.path == "/_admin/events" and method == "GET":
            with self._lock:
                status, payload = 200, {"events": list(self.events)}
        elif parts.path == "/_admin/fail" and method == "POST":
            spec = json.loads(body or b"{}")
            self.fail(spec["method"], spec["path"], int(spec["status"]), int(spec.get("count", 1)))
            status, payload = 200, {"ok": True}
        elif (injected := self._injected(method, parts.path)) is not None:
            status, payload = injected, self.error_body(injected)
        else:
            status, payload = 404, {"message": "Not Found"}
            for route_method, pattern, handler in self._routes:
                match = pattern.match(parts.path)
                if route_method == method and match:
                    request = Request(
                        method, parts.path, parse_qs(parts.query), headers, body, match
                    )
                    status, payload = handler(request)
                    break
        if isinstance(payload, Raw):
            data = payload.data
            http.send_response(status)
            http.send_header("content-type", payload.content_type)
            for name, value in payload.headers.items():
                http.send_header(name, value)
            http.send_header("content-length", str(len(data)))
            http.end_headers()
            http.wfile.write(data)
            return
        data = b"" if payload is None else json.dumps(payload).encode()
        http.send_response(status)
        if payload is not None:
            http.send_header("content-type", "application/json")
        http.send_header("content-length", str(len(data)))
        http.end_headers()
        http.wfile.write(data)


def serve_main(build: Callable[[int], FakeServer], argv: Sequence[str] | None = None) -> None:
    """``python -m testing.fake_x --port N``: serve in the foreground, print the URL."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = build(args.port).start()
    print(server.url, flush=True)
    threading.Event().wait()
