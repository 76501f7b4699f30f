"""Delivery of leases into the running container, renewal pushes, and withdrawal.

Bundles travel only over the container's attached stdin (the brain channel): never in
the container's config (``docker inspect``), never on a command line, never in a host
file. ``apply`` uses these three steps around the run:

    await deliver(channel, lease)              # after acquire, before the first turn
    keeper = asyncio.create_task(keep_fresh(channel, leases))   # during the run
    await withdraw(channel, leases)            # on the way out, also on error / Ctrl-C

``keep_fresh`` raises RefusedError (exit 6) when a budget runs out: it has already wiped
the credential in the container and revoked it, and the run must stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from kagura_agent.errors import KaguraError, RefusedError
from kagura_agent.membrane.leases.broker import RENEW_MARGIN, Lease


class CredentialChannel(Protocol):
    """What the brain channel offers (kagura_agent.brain.channel.BrainChannel)."""

    async def send_credentials(self, lease: str, bundle: Mapping[str, Any]) -> None: ...

    async def revoke_credentials(self, lease: str) -> None: ...


async def deliver(channel: CredentialChannel, lease: Lease) -> None:
    """Push the lease's current bundle into the container (first delivery or renewal)."""
    await channel.send_credentials(lease.id, lease.bundle.to_json())


async def keep_fresh(
    channel: CredentialChannel,
    leases: Sequence[Lease],
    *,
    margin: timedelta = RENEW_MARGIN,
    poll_seconds: float = 30.0,
) -> None:
    """Heartbeat and renew leases until cancelled; push every renewal into the container."""
    while True:
        for lease in leases:
            if lease.closed:
                continue
            try:
                # Provider SDKs block: keep them off the event loop.
                renewed = await asyncio.to_thread(lease.tick, margin)
            except RefusedError:
                await _wipe(channel, lease)
                raise
            if renewed is not None:
                await deliver(channel, lease)
        await asyncio.sleep(poll_seconds)


async def withdraw(channel: CredentialChannel | None, leases: Sequence[Lease]) -> list[str]:
    """Wipe every lease in the container (if still attached), then release it on the host.

    Returns problems instead of raising, so cleanup continues; rows that could not be
    revoked stay open in the ledger for the sweeper.
    """
    problems: list[str] = []
    for lease in leases:
        if channel is not None:
            await _wipe(channel, lease)
        try:
            await asyncio.to_thread(lease.release)
        except KaguraError as exc:
            problems.append(exc.message)
    return problems


async def _wipe(channel: CredentialChannel, lease: Lease) -> None:
    # The container may be gone already; the host-side revoke still happens.
    with contextlib.suppress(TimeoutError, KaguraError, OSError):
        await channel.revoke_credentials(lease.id)
