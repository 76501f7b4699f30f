"""cloudflare: a user API token with exactly the scope's policies and an ``expires_on``.

scope_spec keys: policies (Cloudflare TokenPolicy objects: effect, permission_groups,
resources) — or the shorthand permission_groups (ids) + resources; endpoint (API base
URL, for tests); max_retries (SDK retries, default 2).

The root secret is an API token allowed to create user tokens. Each minted token is
named ``kagura-<lease id>`` so a crash between minting and recording it is still found
(``find``) and revoked by the sweeper; release deletes the token.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, timedelta
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
)

NAME_PREFIX = "kagura-"


def policies_of(scope_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The token policies a scope asks for, in Cloudflare's shape."""
    if scope_spec.get("policies"):
        return [dict(policy) for policy in scope_spec["policies"]]
    groups = scope_spec.get("permission_groups")
    resources = scope_spec.get("resources")
    if not groups or not resources:
        raise UsageError("cloudflare scope_spec needs policies, or permission_groups + resources")
    return [
        {
            "effect": "allow",
            "permission_groups": [{"id": str(group)} for group in groups],
            "resources": dict(resources),
        }
    ]


class CloudflareProvider:
    kind = "cloudflare"
    revocable = True
    min_ttl = 60
    max_ttl = 3600

    def __init__(self, settings: Mapping[str, Any], root_secret: str, clock: Clock) -> None:
        self._clock = clock
        cloudflare = require_extra("cloudflare", "cloudflare")
        self._errors = cloudflare
        self._client = cloudflare.Cloudflare(
            api_token=root_secret,
            base_url=settings.get("endpoint") or None,
            max_retries=int(settings.get("max_retries", 2)),
            timeout=float(settings.get("timeout", 30)),
        )

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        # Cloudflare compares expires_on at second precision; round down so we never
        # outlive the lease we recorded.
        expires_at = (self._clock.now() + timedelta(seconds=ttl_seconds)).replace(microsecond=0)
        token = self._call(
            "create token",
            lambda: self._client.user.tokens.create(
                name=f"{NAME_PREFIX}{lease_id}",
                policies=policies_of(scope_spec),
                expires_on=expires_at.isoformat().replace("+00:00", "Z"),
            ),
        )
        if token is None or not token.id or not token.value:
            raise ProviderError("create token: response without id or value", transient=False)
        value = str(token.value)
        return Minted(
            id=str(token.id),
            expires_at=(token.expires_on or expires_at).astimezone(UTC),
            bundle=Bundle(
                files={"cloudflare/token": value},
                env={
                    "CLOUDFLARE_API_TOKEN": value,
                    "CLOUDFLARE_API_TOKEN_FILE": f"{CREDS_DIR}/cloudflare/token",
                },
            ),
            secrets=(value,),
        )

    def revoke(self, minted_id: str) -> bool:
        self._call("delete token", lambda: self._client.user.tokens.delete(minted_id))
        return True

    def find(self, lease_id: str) -> list[str]:
        name = f"{NAME_PREFIX}{lease_id}"
        tokens = self._call("list tokens", lambda: list(self._client.user.tokens.list()))
        return [str(t.id) for t in tokens if t.name == name and t.id]

    def _call(self, what: str, call: Any) -> Any:
        errors = self._errors
        try:
            return call()
        except errors.APIStatusError as exc:
            raise http_failure(int(exc.status_code), what) from None
        except errors.APIConnectionError as exc:
            raise ProviderError(f"{what}: {type(exc).__name__}", transient=True) from None
        except errors.APIError as exc:
            raise ProviderError(f"{what}: {type(exc).__name__}", transient=False) from None


def create(settings: Mapping[str, Any], root_secret: str, clock: Clock) -> CloudflareProvider:
    return CloudflareProvider(settings, root_secret, clock)
