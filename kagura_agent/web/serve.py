"""Bind the console and serve it with uvicorn: loopback by default, TLS or an explicit
flag for any other address, and the login URL as the first line on stdout."""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from kagura_agent.errors import SetupError, UsageError
from kagura_agent.web.app import ConsoleConfig, create_app
from kagura_agent.web.security import Sessions

DEFAULT_PORT = 8765


@dataclass(frozen=True)
class Binding:
    address: str
    port: int
    cert: Path | None = None
    key: Path | None = None
    insecure: bool = False  # a non-loopback bind without TLS, asked for explicitly

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.address)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(binding: Binding) -> None:
    """Refuse a binding that would put the login token or the session on the network in
    clear (a UsageError naming what to add)."""
    if (binding.cert is None) != (binding.key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    for name, path in (("--tls-cert", binding.cert), ("--tls-key", binding.key)):
        if path is not None and not path.is_file():
            raise UsageError(f"{name} {path}: no such file")
    if binding.loopback or binding.tls or binding.insecure:
        return
    raise UsageError(
        f"--bind {binding.address} is not a loopback address: the login token and the"
        " session cookie would cross the network in clear, and anyone on it could read the"
        " console",
        hint="serve it over TLS (--tls-cert FILE --tls-key FILE), or pass --insecure-bind"
        " if this network is yours alone",
    )


def open_socket(binding: Binding) -> socket.socket:
    host = binding.address.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host == "localhost":
        host, family = "127.0.0.1", socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, binding.port))
    except OSError as exc:
        sock.close()
        raise SetupError(
            f"cannot listen on {binding.address}:{binding.port}: {exc.strerror}",
            hint="choose another --port (0 picks a free one)",
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def login_url(binding: Binding, port: int, token: str) -> str:
    scheme = "https" if binding.tls else "http"
    host = binding.address
    if host in ("0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/login?token={token}"


def serve(
    binding: Binding,
    config: ConsoleConfig,
    *,
    out: TextIO = sys.stdout,
    started: Callable[[str], None] | None = None,
) -> int:
    """Serve until interrupted; the login URL is the first line written to ``out``."""
    import uvicorn

    sock = open_socket(binding)
    port = int(sock.getsockname()[1])
    sessions = Sessions()
    url = login_url(binding, port, sessions.token)
    origin = url.split("/login", 1)[0]
    config = replace(config, port=port, origin=origin, secure=binding.tls,
                     loopback_only=binding.loopback)  # fmt: skip
    app = create_app(config, sessions)
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
        "timeout_graceful_shutdown": 2,
        "limit_concurrency": 64,
    }
    if binding.cert is not None and binding.key is not None:
        options.update(ssl_certfile=str(binding.cert), ssl_keyfile=str(binding.key))
    server = uvicorn.Server(uvicorn.Config(app, **options))
    out.write(url + "\n")
    out.flush()
    if started is not None:
        started(url)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
