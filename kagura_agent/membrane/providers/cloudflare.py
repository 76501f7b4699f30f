"""cloudflare: a user API token with exactly the scope's policies and an ``expires_on``.

scope_spec keys: policies (Cloudflare TokenPolicy objects: effect, permission_groups,
resources) — or the shorthand permission_groups (ids) + resources; endpoint (API base
URL, for tests); max_retries (SDK retries, default 2).

The root secret is an API token allowed to create user tokens. Each minted token is
named ``kagura-<lease id>`` so a crash between minting and recording it is still found
(``find``) and revoked by the sweeper; release deletes the token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
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
from kagura_agent.membrane.providers.traits import TRAITS

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
    # revocable, min_ttl, max_ttl: membrane/providers/traits.py (one table for all)
    revocable = TRAITS["cloudflare"].revocable
    min_ttl = TRAITS["cloudflare"].min_ttl
    max_ttl = TRAITS["cloudflare"].max_ttl

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
            if token is not None and token.id:
                self.revoke(str(token.id))  # minted, but nothing to hand out: never left live
            raise ProviderError("create token: response without id or value", transient=False)
        wider = _wider(policies_of(scope_spec), expires_at, token)
        if wider:
            # Never hand out more than was approved: delete it and fail.
            self.revoke(str(token.id))
            raise ProviderError(
                f"the token Cloudflare created is wider than asked ({', '.join(wider)}); deleted",
                transient=False,
            )
        value = str(token.value)
        return Minted(
            id=str(token.id),
            expires_at=token.expires_on.astimezone(UTC),
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


def _policy_key(policy: Mapping[str, Any]) -> str:
    """A policy's power, comparable: its effect, permission group ids and resources."""
    groups = sorted(
        str(group.get("id") if isinstance(group, Mapping) else group)
        for group in policy.get("permission_groups") or []
    )
    return json.dumps(
        [str(policy.get("effect")), groups, policy.get("resources") or {}], sort_keys=True
    )


def _wider(asked: list[dict[str, Any]], expires_at: datetime, token: Any) -> list[str]:
    """What the token Cloudflare answered with holds beyond what was asked (empty: nothing):
    an allow policy not asked for, an asked deny policy missing, no expiry or a later one."""
    wider: list[str] = []
    granted = [
        policy.model_dump() if hasattr(policy, "model_dump") else dict(policy)
        for policy in token.policies or []
    ]
    asked_keys = {_policy_key(policy) for policy in asked}
    granted_keys = {_policy_key(policy) for policy in granted}
    for policy in granted:
        if policy.get("effect") != "deny" and _policy_key(policy) not in asked_keys:
            wider.append(f"an {policy.get('effect')} policy not asked for")
    for policy in asked:
        if policy.get("effect") == "deny" and _policy_key(policy) not in granted_keys:
            wider.append("an asked deny policy missing")
    if token.expires_on is None:
        wider.append("no expiry")
    elif token.expires_on.astimezone(UTC) > expires_at + timedelta(seconds=1):
        wider.append(f"expires {token.expires_on.astimezone(UTC).isoformat()}, past the lease")
    return wider


def create(settings: Mapping[str, Any], root_secret: str, clock: Clock) -> CloudflareProvider:
    return CloudflareProvider(settings, root_secret, clock)
