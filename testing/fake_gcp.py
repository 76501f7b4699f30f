"""A fake of the Google OAuth token endpoint and IAM Credentials, for the real client.

    POST /token                        OAuth 2.0 JWT-bearer grant (service-account key flow)
    POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken   (REST transport)
    POST /revoke                       OAuth token revocation (?token= or form body)

Callers authenticate as Google accepts them: with a token from ``{url}/token`` (whose
JWT grant must be signed by a registered key) or with a self-signed service-account JWT
(what the GAPIC client sends by default), verified against ``register_key``. The IAM
client is built with ``api_endpoint={url}``. Mints and revocations are recorded. Run standalone:
``python -m testing.fake_gcp --port N``.
"""

from __future__ import annotations

import secrets
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, unquote

import jwt

from testing.fake_http import FakeServer, Request, serve_main


def _google_error(status: int, message: str, reason: str) -> tuple[int, Any]:
    return status, {"error": {"code": status, "message": message, "status": reason}}


class FakeGcp(FakeServer):
    """Issues caller tokens for any well-formed JWT grant; impersonation needs one."""

    def __init__(self, port: int = 0, allowed_accounts: tuple[str, ...] = ()) -> None:
        super().__init__(port=port)
        self.allowed_accounts = allowed_accounts  # empty: every account may be impersonated
        self.caller_tokens: set[str] = set()
        self.keys: dict[str, str] = {}  # private_key_id -> public key PEM
        self.minted: dict[str, dict[str, Any]] = {}
        self.issued: list[str] = []  # every token minted, revoked since or not
        self._state_lock = threading.Lock()
        self.route("POST", r"/token", self._token)
        self.route(
            "POST",
            r"/v1/projects/-/serviceAccounts/(?P<account>[^/:]+):generateAccessToken",
            self._generate,
        )
        self.route("POST", r"/revoke", self._revoke)
        # The tokens it issued and still holds: a fake Vertex AI trusts them
        # (testing/fake_endpoint_runtime.py), as Google's services trust its token service.
        self.route("GET", r"/_admin/tokens", self._tokens)

    def error_body(self, status: int) -> Any:
        return _google_error(status, "injected failure", "UNAVAILABLE")[1]

    def register_key(self, key_id: str, public_key_pem: str) -> None:
        """Trust a service-account key (its ``private_key_id`` and public half)."""
        self.keys[key_id] = public_key_pem

    def _verified(self, assertion: str) -> bool:
        try:
            kid = str(jwt.get_unverified_header(assertion).get("kid", ""))
            key = self.keys.get(kid)
            if key is None:
                return False
            jwt.decode(assertion, key, algorithms=["RS256"], options={"verify_aud": False})
        except jwt.PyJWTError:
            return False
        return True

    def _token(self, request: Request) -> tuple[int, Any]:
        form = parse_qs(request.body.decode())
        grant = form.get("grant_type", [""])[0]
        assertion = form.get("assertion", [""])[0]
        if grant != "urn:ietf:params:oauth:grant-type:jwt-bearer" or not self._verified(assertion):
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        token = "ya29.caller-" + secrets.token_urlsafe(24)
        with self._state_lock:
            self.caller_tokens.add(token)
        self.record("caller-token")
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    def _generate(self, request: Request) -> tuple[int, Any]:
        bearer = request.bearer() or ""
        with self._state_lock:
            known = bearer in self.caller_tokens
        if not known and not self._verified(bearer):
            return _google_error(
                401, "Request had invalid authentication credentials.", "UNAUTHENTICATED"
            )
        account = unquote(request.match["account"])
        if self.allowed_accounts and account not in self.allowed_accounts:
            return _google_error(
                403, "Permission 'iam.serviceAccounts.getAccessToken' denied", "PERMISSION_DENIED"
            )
        body = request.json()
        lifetime = int(str(body.get("lifetime", "3600s")).rstrip("s") or 3600)
        if lifetime > 3600:
            return _google_error(400, "lifetime exceeds 3600s", "INVALID_ARGUMENT")
        token = "ya29.minted-" + secrets.token_urlsafe(32)
        expires = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=lifetime)
        expire_time = expires.isoformat().replace("+00:00", "Z")
        with self._state_lock:
            self.minted[token] = {"account": account, "scope": body.get("scope", [])}
            self.issued.append(token)
        self.record(
            "mint",
            account=account,
            scope=body.get("scope", []),
            lifetime=lifetime,
            delegates=body.get("delegates", []),
            expire_time=expire_time,
        )
        return 200, {"accessToken": token, "expireTime": expire_time}

    def _tokens(self, request: Request) -> tuple[int, Any]:
        with self._state_lock:
            return 200, {"tokens": sorted(self.minted)}

    def _revoke(self, request: Request) -> tuple[int, Any]:
        form = parse_qs(request.body.decode())
        token = (request.query.get("token") or form.get("token") or [""])[0]
        with self._state_lock:
            found = self.minted.pop(token, None)
        if found is None:
            return 400, {"error": "invalid_token", "error_description": "Token expired or revoked"}
        self.record("revoke", account=found["account"])
        return 200, {}


if __name__ == "__main__":
    serve_main(lambda port: FakeGcp(port), sys.argv[1:])
