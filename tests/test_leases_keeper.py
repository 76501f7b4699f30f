"""deliver / keep_fresh / withdraw over a recording channel (the docker test drives the
real brain channel); budgets run out → wiped in the container, revoked, RefusedError."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError
from kagura_agent.membrane.leases import Broker, LeaseRequest, deliver, keep_fresh, withdraw
from kagura_agent.state import open_store
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")


class RecordingChannel:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any] | None]] = []

    async def send_credentials(self, lease: str, bundle: Mapping[str, Any]) -> None:
        self.calls.append(("send", lease, dict(bundle)))

    async def revoke_credentials(self, lease: str) -> None:
        self.calls.append(("revoke", lease, None))


def request(fake: FakeCloudflare, renewals: int) -> LeaseRequest:
    return LeaseRequest.from_plan(
        {
            "name": "cf-dns",
            "provider": "cloudflare-main",
            "type": "cloudflare",
            "scope": "dns-edit",
            "scope_spec": {
                "permission_groups": ["4755a26eedb94da69e1066d98aa820be"],
                "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
                "endpoint": fake.url + "/client/v4",
                "endpoint_addresses": ["127.0.0.1/32"],
                "max_retries": 0,
            },
            "ttl_seconds": 900,
            "renewals": renewals,
            "budget_seconds": 3600,
            "secret_ref": "env:KAGURA_TEST_CF_ROOT",
            "standing": False,
            "class": "baseline",
        }
    )


def test_renewals_are_pushed_and_exhaustion_wipes_then_refuses(
    cloudflare: FakeCloudflare, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    lease = Broker(store, clock=clock).acquire(request(cloudflare, renewals=1))
    channel = RecordingChannel()

    async def scenario() -> None:
        await deliver(channel, lease)
        # Inside the renewal margin: the first tick renews (pushed). The renewed credential
        # is the last its budget allows: it is held to its end, then exhausted (wiped).
        clock.advance(timedelta(minutes=11))
        keeper = asyncio.create_task(keep_fresh(channel, [lease], poll_seconds=0.01))
        await asyncio.sleep(0.5)
        assert not keeper.done() and lease.renewals_used == 1 and not lease.closed
        clock.advance(lease.expires_at - clock.now() - timedelta(seconds=9))
        with pytest.raises(RefusedError, match="budget exhausted"):
            await asyncio.wait_for(keeper, 30)

    asyncio.run(scenario())
    kinds = [(kind, lease_id) for kind, lease_id, _ in channel.calls]
    assert kinds == [("send", lease.id), ("send", lease.id), ("revoke", lease.id)]
    first, second = channel.calls[0][2], channel.calls[1][2]
    assert first and second and first["files"] != second["files"]
    assert cloudflare.live_tokens() == [] and len(cloudflare.ops("revoke")) == 2
    store.close()


def test_withdraw_wipes_and_releases_every_lease(
    cloudflare: FakeCloudflare, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    store = open_store()
    broker = Broker(store)
    leases = [broker.acquire(request(cloudflare, renewals=0)) for _ in range(2)]
    channel = RecordingChannel()
    assert asyncio.run(withdraw(channel, leases)) == []
    assert [kind for kind, _, _ in channel.calls] == ["revoke", "revoke"]
    assert all(lease.closed for lease in leases) and cloudflare.live_tokens() == []
    store.close()
