"""Canary root secrets and minted values never appear in logs, ledger rows, reprs,
exception messages or CLI output — even when the provider echoes them in error bodies."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.clock import FixedClock
from kagura_agent.errors import KaguraError
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger, Sweeper
from kagura_agent.state import open_store
from testing.fake_cloudflare import FakeCloudflare

ROOT_CANARY = "cfroot-CANARY-5b1e0c7d9a2f4e6b8c0d1e2f3a4b"


class EchoingCloudflare(FakeCloudflare):
    """A misbehaving API that puts the caller's root token into its error bodies."""

    def error_body(self, status: int) -> Any:
        return {"success": False, "errors": [{"code": 1, "message": f"bad token {ROOT_CANARY}"}]}


@pytest.fixture()
def cloudflare() -> Iterator[FakeCloudflare]:
    fake = EchoingCloudflare(root_token=ROOT_CANARY).start()
    yield fake
    fake.stop()


def entry(fake: FakeCloudflare) -> dict[str, Any]:
    return {
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
        "renewals": 1,
        "budget_seconds": 1800,
        "secret_ref": "env:KAGURA_TEST_CF_ROOT",
        "standing": False,
        "class": "baseline",
    }


def test_canaries_never_leak(
    cloudflare: FakeCloudflare,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_CANARY)
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    broker = Broker(store, clock=clock)
    seen: list[str] = []  # every text that left the broker: reprs, messages, output

    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    assert lease.minted is not None
    minted_values = list(lease.minted.sensitive_values())
    seen += [repr(lease), repr(lease.minted), repr(lease.bundle), repr(broker.redactor)]

    clock.advance(timedelta(minutes=11))
    renewed = lease.tick()
    assert renewed is not None
    minted_values += renewed.sensitive_values()

    # Failures whose bodies echo the root token: messages must not carry it.
    cloudflare.fail("POST", "/client/v4/user/tokens", 500)
    with pytest.raises(KaguraError) as failed_mint:
        broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    seen += [failed_mint.value.render(), str(failed_mint.value)]
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 401, count=10)
    with pytest.raises(KaguraError) as failed_release:
        lease.release()
    seen.append(failed_release.value.render())

    with store.transaction() as conn:  # orphan the rows so the sweeper acts on them
        conn.execute("UPDATE lease_grants SET owner_start = 'gone'")
    report = Sweeper(store, clock=clock, sleep=lambda _: None).sweep()
    assert report.poison  # the 401s make it poison: kept, shown
    seen.append(json.dumps(report.__dict__))
    for row in Ledger(store, clock).rows():
        seen += [repr(row), json.dumps(row.to_json())]
    assert main(["leases", "list", "--all"]) == 0
    assert main(["leases", "list", "--all", "--json"]) == 0
    seen.append(capsys.readouterr().out)
    assert caplog.records  # the SDKs did log at DEBUG: those lines are checked too
    seen += [record.getMessage() for record in caplog.records]
    store.close()
    database = b"".join(p.read_bytes() for p in state_dir.glob("state.db*"))

    canaries = [ROOT_CANARY, *minted_values]
    assert len(minted_values) >= 4
    for text in seen:
        for canary in canaries:
            assert canary not in text
    for canary in canaries:
        assert canary.encode() not in database
    # And the redactor knows them all, for event and log scrubbing downstream.
    scrubbed = broker.redactor.scrub(" ".join(canaries))
    assert all(canary not in scrubbed for canary in canaries)
