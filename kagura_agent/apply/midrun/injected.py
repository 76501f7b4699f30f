"""The brain's credential, which the run's proxy holds and the container never sees.

The plan's ``brain.model_endpoint`` (plan/endpoint.py) says where the brain's model calls
go and how their credential travels; its lease is the one apply hands to the proxy
(:func:`injection_of`) instead of the container. A lease that is renewed while the run
goes on (an AWS STS key, a GCP token: minutes to an hour) is renewed here too, and each
renewal replaces the credential in the running proxy (:class:`ProxyCredentials`, the
proxy's side of the leases keeper); a budget that runs out withdraws it there and stops
the run, as it does for a credential inside the container. A standing key (static) is
held for the run as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from kagura_agent.errors import RefusedError
from kagura_agent.membrane.egress.modelport import ANTHROPIC_API, Injection
from kagura_agent.membrane.leases import Lease, keep_fresh
from kagura_agent.membrane.leases.broker import RENEW_MARGIN
from kagura_agent.plan.injection import PLACEHOLDER
from kagura_agent.plan.model import Plan

# What the proxy holds once a lease's budget ran out: no call carries a credential again.
WITHDRAWN = "withdrawn"
RENEW_CHECK_SECONDS = 30.0


class CredentialHolder(Protocol):
    """The run's proxy, as far as its injected credential goes (EgressSession)."""

    def renew_credential(self, secret: str) -> None: ...


def injection_of(plan: Plan) -> tuple[Injection, dict[str, str]]:
    """Where the proxy sends the brain's calls, and what the CLI is told (no secret)."""
    endpoint = plan["brain"].get("model_endpoint")
    if endpoint is None:  # a plan saved before model endpoints: the Anthropic API
        return ANTHROPIC_API, {"ANTHROPIC_API_KEY": PLACEHOLDER}
    return Injection.for_endpoint(endpoint), dict(endpoint["environment"])


def proxy_secret(lease: Lease) -> str | None:
    """The lease's credential as the proxy injects it (None before it is minted)."""
    minted = lease.minted
    if minted is None:
        return None
    return minted.for_proxy or (minted.secrets[0] if minted.secrets else None)


def renewed_in_run(lease: Lease) -> bool:
    """Whether the lease is renewed while the run goes on (not a standing key)."""
    return lease.request.type != "static"


class ProxyCredentials:
    """The leases keeper's channel to the proxy: a renewal replaces the credential the
    proxy injects, a withdrawal leaves it none."""

    def __init__(self, proxy: CredentialHolder, leases: Sequence[Lease]) -> None:
        self._proxy = proxy
        self._leases = {lease.id: lease for lease in leases}

    async def send_credentials(self, lease: str, bundle: Mapping[str, Any]) -> None:
        secret = proxy_secret(self._leases[lease])
        if secret is not None:
            self._proxy.renew_credential(secret)

    async def revoke_credentials(self, lease: str) -> None:
        self._proxy.renew_credential(WITHDRAWN)


async def keep_injected_fresh(
    proxy: CredentialHolder,
    leases: Sequence[Lease],
    on_exhausted: Callable[[str], Awaitable[None]],
    *,
    margin: timedelta = RENEW_MARGIN,
    poll_seconds: float = RENEW_CHECK_SECONDS,
) -> None:
    """Renew the injected leases inside their budget until cancelled; when a budget runs
    out (the proxy already holds no credential), ``on_exhausted`` stops the run."""
    renewed = [lease for lease in leases if renewed_in_run(lease)]
    if not renewed:
        return
    try:
        await keep_fresh(
            ProxyCredentials(proxy, renewed), renewed, margin=margin, poll_seconds=poll_seconds
        )
    except RefusedError as exc:
        await on_exhausted(exc.message)
