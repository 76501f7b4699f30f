"""gcp: IAM Credentials generateAccessToken — service-account impersonation, scoped, timed.

scope_spec keys: service_account (email to impersonate, required), scopes (OAuth scopes;
cloud-platform only with full_access: true, required otherwise), delegates (chain of service accounts), endpoint (IAM Credentials
API base URL, for tests; the REST transport is used so a plain HTTP fake works),
revoke_endpoint (OAuth revocation URL, default Google's).

The root secret is a service-account key JSON (its token_uri is honoured) or a bare OAuth
access token of the caller. Revoking an access token needs the token itself, which only
this process holds: release revokes it at the OAuth revocation endpoint; after a crash
the sweeper can only record the expiry (at most one hour), hence ``revocable`` False.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kagura_agent.clock import Clock
from kagura_agent.errors import UsageError
from kagura_agent.membrane.providers import (
    CREDS_DIR,
    Bundle,
    Minted,
    ProviderError,
    http_failure,
    require_extra,
    require_narrowing,
)
from kagura_agent.membrane.providers.traits import TRAITS

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
REVOKE_URL = "https://oauth2.googleapis.com/revoke"


def _caller_credentials(root_secret: str) -> Any:
    text = root_secret.strip()
    if text.startswith("{"):
        service_account = require_extra("google.oauth2.service_account", "gcp")
        try:
            info = json.loads(text)
            return service_account.Credentials.from_service_account_info(
                info, scopes=[CLOUD_PLATFORM]
            )
        except (ValueError, KeyError):
            raise UsageError(
                "gcp root secret is JSON but not a usable service-account key"
            ) from None
    oauth2 = require_extra("google.oauth2.credentials", "gcp")
    return oauth2.Credentials(token=text)


class GcpProvider:
    kind = "gcp"
    # revocable, min_ttl, max_ttl: membrane/providers/traits.py (one table for all)
    revocable = TRAITS["gcp"].revocable
    min_ttl = TRAITS["gcp"].min_ttl
    max_ttl = TRAITS["gcp"].max_ttl

    def __init__(self, settings: Mapping[str, Any], root_secret: str) -> None:
        iam = require_extra("google.cloud.iam_credentials_v1", "gcp")
        self._api_exceptions = require_extra("google.api_core.exceptions", "gcp")
        self._auth_exceptions = require_extra("google.auth.exceptions", "gcp")
        options: dict[str, Any] = {}
        if settings.get("endpoint"):
            options["api_endpoint"] = str(settings["endpoint"])
        self._revoke_url = str(settings.get("revoke_endpoint") or REVOKE_URL)
        self._tokens: dict[str, str] = {}  # minted id -> token, for in-process revocation
        self._client = iam.IAMCredentialsClient(
            credentials=_caller_credentials(root_secret),
            transport="rest",
            client_options=options or None,
        )

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        account = scope_spec.get("service_account")
        if not isinstance(account, str) or "@" not in account:
            raise UsageError("gcp scope_spec needs service_account (an email)")
        require_narrowing("gcp", scope_spec)
        duration = require_extra("google.protobuf.duration_pb2", "gcp")
        lifetime = duration.Duration(seconds=max(self.min_ttl, min(self.max_ttl, ttl_seconds)))
        delegates = [f"projects/-/serviceAccounts/{d}" for d in scope_spec.get("delegates", [])]
        response = self._call(
            lambda: self._client.generate_access_token(
                name=f"projects/-/serviceAccounts/{account}",
                scope=list(scope_spec.get("scopes") or [CLOUD_PLATFORM]),
                delegates=delegates,
                lifetime=lifetime,
                retry=None,
                timeout=30.0,
            )
        )
        token = str(response.access_token)
        expires = response.expire_time
        expires_at = datetime.fromtimestamp(expires.timestamp(), UTC)
        minted_id = f"gcp:{account}:{lease_id}"
        self._tokens[minted_id] = token
        return Minted(
            id=minted_id,
            expires_at=expires_at,
            bundle=Bundle(
                files={"gcp/access-token": token},
                env={
                    "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": f"{CREDS_DIR}/gcp/access-token",
                    "GOOGLE_OAUTH_ACCESS_TOKEN": token,
                },
            ),
            secrets=(token,),
            for_proxy=token,
        )

    def revoke(self, minted_id: str) -> bool:
        """Revoke a token this process minted; others lapse at their expiry."""
        token = self._tokens.get(minted_id)
        if token is None:
            return False
        data = urllib.parse.urlencode({"token": token}).encode()
        request = urllib.request.Request(self._revoke_url, data=data, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 400:  # 400 invalid_token: already revoked or expired
                raise http_failure(exc.code, "revoke access token") from None
        except OSError as exc:
            raise ProviderError(
                f"revoke access token: {type(exc).__name__}", transient=True
            ) from None
        self._tokens.pop(minted_id, None)
        return True

    def find(self, lease_id: str) -> list[str]:
        return []

    def _call(self, call: Any) -> Any:
        api, auth = self._api_exceptions, self._auth_exceptions
        try:
            return call()
        except api.GoogleAPICallError as exc:
            code = exc.code if isinstance(exc.code, int) else 0
            raise http_failure(code, "generateAccessToken") from None
        except auth.TransportError as exc:
            raise ProviderError(
                f"generateAccessToken: {type(exc).__name__}", transient=True
            ) from None
        except auth.GoogleAuthError as exc:
            transient = bool(getattr(exc, "retryable", False))
            raise ProviderError(
                f"generateAccessToken: caller credentials refused ({type(exc).__name__})",
                transient=transient,
            ) from None
        except OSError as exc:  # requests' connection errors derive from IOError
            raise ProviderError(
                f"generateAccessToken: {type(exc).__name__}", transient=True
            ) from None


def create(settings: Mapping[str, Any], root_secret: str, clock: Clock) -> GcpProvider:
    """``clock`` is unused: the provider's API dates its credentials."""
    return GcpProvider(settings, root_secret)
