"""A fake of Cloudflare's user API token endpoints (client/v4), enough for the real SDK.

    POST   /client/v4/user/tokens            create (needs the root token as Bearer)
    GET    /client/v4/user/tokens            list (paged: ?page=N)
    GET    /client/v4/user/tokens/verify     verify the calling token
    DELETE /client/v4/user/tokens/{id}       revoke

Every mint and revocation is recorded (``server.ops("mint")``, ``ops("revoke")`` or
GET /_admin/events). Run standalone: ``python -m testing.fake_cloudflare --port N``.
"""

from __future__ import annotations

import secrets
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from testing.fake_http import FakeServer, Request, serve_main

PREFIX = "/client/v4"
ROOT_TOKEN = "cf-root-canary-0123456789abcdefABCDEF0123"  # a test canary, not a real token


def _envelope(result: Any, status: int = 200, **extra: Any) -> tuple[int, Any]:
    return status, {"success": True, "errors": [], "messages": [], "result": result, **extra}


def _error(status: int, code: int, message: str) -> tuple[int, Any]:
    body = {"success": False, "errors": [{"code": code, "message": message}], "messages": []}
    return status, body


class FakeCloudflare(FakeServer):
    """Tokens live in memory; ``root_token`` is the only token that may create others."""

    def __init__(self, port: int = 0, root_token: str = ROOT_TOKEN) -> None:
        super().__init__(port=port)
        self.root_token = root_token
        self.tokens: dict[str, dict[str, Any]] = {}
        # A misbehaving API, for tests: policies added to every minted token, and an
        # expiry it ignores (None: the token never expires) or moves later by seconds.
        self.overgrant_policies: list[dict[str, Any]] = []
        self.ignore_expiry = False
        self.later_expiry_seconds = 0
        self.drop_deny_policies = False  # a token without the deny policies it was asked
        self._tokens_lock = threading.Lock()
        self.route("POST", rf"{PREFIX}/user/tokens", self._create)
        self.route("GET", rf"{PREFIX}/user/tokens", self._list)
        self.route("GET", rf"{PREFIX}/user/tokens/verify", self._verify)
        self.route("DELETE", rf"{PREFIX}/user/tokens/(?P<id>[0-9a-f]+)", self._delete)

    def error_body(self, status: int) -> Any:
        return _error(status, 10000, "injected failure")[1]

    def live_tokens(self) -> list[dict[str, Any]]:
        with self._tokens_lock:
            return [dict(t) for t in self.tokens.values()]

    def _create(self, request: Request) -> tuple[int, Any]:
        if request.bearer() != self.root_token:
            return _error(403, 9109, "Unauthorized to access requested resource")
        body = request.json()
        if not body.get("name") or not body.get("policies"):
            return _error(400, 1001, "name and policies are required")
        token_id = secrets.token_hex(16)
        value = secrets.token_urlsafe(30)[:40]
        now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        expires_on = None if self.ignore_expiry else body.get("expires_on")
        if expires_on and self.later_expiry_seconds:
            later = datetime.fromisoformat(expires_on.replace("Z", "+00:00")) + timedelta(
                seconds=self.later_expiry_seconds
            )
            expires_on = later.isoformat().replace("+00:00", "Z")
        granted = [*body["policies"], *self.overgrant_policies]
        if self.drop_deny_policies:
            granted = [policy for policy in granted if policy.get("effect") != "deny"]
        token = {
            "id": token_id,
            "name": body["name"],
            "status": "active",
            "issued_on": now,
            "modified_on": now,
            "expires_on": expires_on,
            "policies": [{"id": secrets.token_hex(16), **policy} for policy in granted],
        }
        with self._tokens_lock:
            self.tokens[token_id] = {**token, "value": value}
        self.record(
            "mint",
            id=token_id,
            name=body["name"],
            expires_on=body.get("expires_on"),
            policies=body["policies"],
        )
        return _envelope({**token, "value": value})

    def _list(self, request: Request) -> tuple[int, Any]:
        if request.bearer() != self.root_token:
            return _error(403, 9109, "Unauthorized to access requested resource")
        page = int(request.query.get("page", ["1"])[0])
        per_page = int(request.query.get("per_page", ["20"])[0])
        with self._tokens_lock:
            everything = [
                {k: v for k, v in t.items() if k != "value"} for t in self.tokens.values()
            ]
        chunk = everything[(page - 1) * per_page : page * per_page]
        info = {
            "page": page,
            "per_page": per_page,
            "count": len(chunk),
            "total_count": len(everything),
        }
        return _envelope(chunk, result_info=info)

    def _verify(self, request: Request) -> tuple[int, Any]:
        presented = request.bearer()
        with self._tokens_lock:
            found = [t for t in self.tokens.values() if t["value"] == presented]
        if not found:
            return _error(401, 1000, "Invalid API Token")
        token = found[0]
        expires = token.get("expires_on")
        if expires and datetime.fromisoformat(expires.replace("Z", "+00:00")) <= datetime.now(UTC):
            return _envelope({"id": token["id"], "status": "expired"})
        return _envelope({"id": token["id"], "status": "active", "expires_on": expires})

    def _delete(self, request: Request) -> tuple[int, Any]:
        if request.bearer() != self.root_token:
            return _error(403, 9109, "Unauthorized to access requested resource")
        token_id = request.match["id"]
        with self._tokens_lock:
            removed = self.tokens.pop(token_id, None)
        if removed is None:
            return _error(404, 1003, "Token not found")
        self.record("revoke", id=token_id, name=removed["name"])
        return _envelope({"id": token_id})


if __name__ == "__main__":
    serve_main(lambda port: FakeCloudflare(port), sys.argv[1:])
