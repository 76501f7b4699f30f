"""Who may see the console, and the browser's part in keeping it so.

- Login: the console prints one URL carrying a one-time token. Opening it trades the
  token for a session: a random id in an ``HttpOnly``, ``SameSite=Strict`` cookie
  (``Secure`` under TLS). The token works once; every other request without a live
  session is answered 401, so a page elsewhere cannot read the console, and a link from
  elsewhere carries no cookie.
- Writes (an approval) also need the session's CSRF token in the form, compared in
  constant time, and the browser's word that the form was sent from the console's own
  page (``Sec-Fetch-Site: same-origin``; an ``Origin`` naming another site is refused).
- Host: on a loopback bind only loopback names are served (a DNS-rebinding page has
  another name).
- Headers on every response: a CSP without ``unsafe-inline`` (scripts and styles only
  from the console's own files), no framing, no referrer, no sniffing, no caching.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

COOKIE = "kagura_console"
SESSION_SECONDS = 12 * 3600
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Session:
    id: str
    csrf: str
    started: float


class Sessions:
    """The one login token and the sessions it opened (in memory: a restart logs out)."""

    def __init__(self, token: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.token = token or secrets.token_urlsafe(32)
        self._used = False
        self._sessions: dict[str, Session] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def login(self, offered: str) -> Session | None:
        """A new session for the login token, once; None for anything else."""
        with self._lock:
            if self._used or not hmac.compare_digest(offered.encode(), self.token.encode()):
                return None
            self._used = True
            session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock())
            self._sessions[session.id] = session
            return session

    def get(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        with self._lock:
            session = self._sessions.get(cookie)
            if session is None:
                return None
            if self._clock() - session.started > SESSION_SECONDS:
                del self._sessions[cookie]
                return None
            return session


def csrf_ok(session: Session, offered: str) -> bool:
    return hmac.compare_digest(offered.encode(), session.csrf.encode())


def cookie_header(session: Session, *, secure: bool) -> str:
    flags = "; HttpOnly; SameSite=Strict; Path=/"
    flags += f"; Max-Age={SESSION_SECONDS}" + ("; Secure" if secure else "")
    return f"{COOKIE}={session.id}{flags}"


def host_allowed(host: str, port: int, loopback_only: bool) -> bool:
    """Whether a request's Host header names this console."""
    if not loopback_only:
        return True
    return host in {f"{name}:{port}" for name in LOOPBACK_NAMES}


class Guard:
    """ASGI middleware: the Host check, the session check (but for the login page and the
    static files), and the security headers on every response. The session found is put
    in ``scope["state"]["session"]``."""

    def __init__(self, app: App, sessions: Sessions, *, port: int, loopback_only: bool) -> None:
        self.app = app
        self.sessions = sessions
        self.port = port
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                message["headers"] = headers
            await send(message)

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not host_allowed(headers.get("host", ""), self.port, self.loopback_only):
            await _plain(with_headers, 421, "this console answers to its own address only")
            return
        path = str(scope["path"])
        if path not in ("/login", "/favicon.ico") and not path.startswith("/static/"):
            session = self.sessions.get(_cookie(headers.get("cookie", "")))
            if session is None:
                await _plain(
                    with_headers,
                    401,
                    "not logged in: open the URL `kagura-agent web` printed when it started",
                )
                return
            scope.setdefault("state", {})["session"] = session
        await self.app(scope, receive, with_headers)


def _cookie(header: str) -> str | None:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return None


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
