"""The sweeper: orphans revoked, transient failures retried with backoff, poison kept."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.clock import FixedClock
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger, Sweeper
from kagura_agent.processes import owner_alive, process_start
from kagura_agent.state import StateStore, open_store
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare
from testing.fake_gcp import FakeGcp

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")

# The fakes listen on loopback: declared as the providers' own address.
LOCAL = {"endpoint_addresses": ["127.0.0.1/32"]}
SCOPE = {
    "permission_groups": ["4755a26eedb94da69e1066d98aa820be"],
    "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
}


@pytest.fixture()
def store(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StateStore]:
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    db = open_store()
    yield db
    db.close()


@pytest.fixture()
def clock() -> FixedClock:
    return FixedClock(datetime.now(UTC).replace(microsecond=0))


def request(cloudflare: FakeCloudflare) -> LeaseRequest:
    return LeaseRequest.from_plan(
        {
            "name": "cf-dns",
            "provider": "cloudflare-main",
            "type": "cloudflare",
            "scope": "dns-edit",
            "scope_spec": {
                **SCOPE,
                "endpoint": cloudflare.url + "/client/v4",
                "max_retries": 0,
                **LOCAL,
            },
            "ttl_seconds": 900,
            "renewals": 2,
            "budget_seconds": 3600,
            "secret_ref": "env:KAGURA_TEST_CF_ROOT",
            "standing": False,
            "class": "baseline",
        }
    )


def orphan(store: StateStore) -> None:
    """Make every open row look owned by a process that is gone (a reused pid)."""
    with store.transaction() as conn:
        conn.execute("UPDATE lease_grants SET owner_start = 'not-this-process'")


def test_owner_liveness_notices_pid_reuse() -> None:
    me = os.getpid()
    assert owner_alive(me, process_start(me))
    assert not owner_alive(me, "not-this-process")
    assert not owner_alive(None, None)


def test_leases_held_by_a_running_process_are_left_alone(
    store: StateStore, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    Broker(store, clock=clock).acquire(request(cloudflare))
    report = Sweeper(store, clock=clock).sweep()
    assert len(report.held) == 1 and cloudflare.ops("revoke") == []


def test_transient_failures_retry_with_backoff_then_succeed(
    store: StateStore, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    Broker(store, clock=clock).acquire(request(cloudflare))
    orphan(store)
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 503, count=3)
    slept: list[float] = []
    sweeper = Sweeper(store, clock=clock, sleep=slept.append)

    first = sweeper.sweep()
    assert len(first.retry_later) == 1 and slept == [0.5, 1.0]
    [row] = Ledger(store, clock).open_rows()
    assert row.state == "live" and row.attempts == 1 and row.last_error
    assert row.next_attempt_at == clock.now() + timedelta(seconds=30)

    # Before the scheduled retry the row is not touched (no request reaches the fake).
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 503, count=1)
    assert len(sweeper.sweep().retry_later) == 1
    assert cloudflare.ops("revoke") == []

    clock.advance(timedelta(seconds=31))
    cloudflare.clear_failures()
    assert len(sweeper.sweep().revoked) == 1
    assert len(cloudflare.ops("revoke")) == 1
    assert Ledger(store, clock).open_rows() == []


def test_poison_is_kept_shown_and_never_dropped(
    store: StateStore,
    cloudflare: FakeCloudflare,
    clock: FixedClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    Broker(store, clock=clock).acquire(request(cloudflare))
    orphan(store)
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 403, count=100)
    slept: list[float] = []
    sweeper = Sweeper(store, clock=clock, sleep=slept.append)
    assert len(sweeper.sweep().poison) == 1
    assert slept == []  # retrying a 403 cannot help: no backoff spent on it
    clock.advance(timedelta(days=2))
    assert len(sweeper.sweep().poison) == 1  # still there, still open
    [row] = Ledger(store, clock).open_rows()
    assert row.state == "poison" and "403" in (row.last_error or "")

    assert main(["leases", "list"]) == 0
    assert "poison" in capsys.readouterr().out
    assert main(["leases", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["leases"]
    assert [item["state"] for item in listed] == ["poison"]

    # The operator fixes access and retries by id: revoked for real.
    cloudflare.clear_failures()
    assert main(["leases", "revoke", row.id]) == 0
    assert len(cloudflare.ops("revoke")) == 1
    assert Ledger(store, clock).open_rows() == []


def test_revoke_cli_refuses_when_it_cannot_revoke_and_acknowledge_closes(
    store: StateStore, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    lease = Broker(store, clock=clock).acquire(request(cloudflare))
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 401, count=10)
    assert main(["leases", "revoke", lease.id]) == 6
    assert main(["leases", "revoke", lease.id, "--acknowledge"]) == 0
    assert Ledger(store, clock).open_rows() == []
    assert main(["leases", "revoke", "g-nope"]) == 2


def test_unresolvable_root_secret_is_transient(
    store: StateStore,
    cloudflare: FakeCloudflare,
    clock: FixedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Broker(store, clock=clock).acquire(request(cloudflare))
    orphan(store)
    monkeypatch.delenv("KAGURA_TEST_CF_ROOT")
    report = Sweeper(store, clock=clock, sleep=lambda _: None).sweep()
    assert len(report.retry_later) == 1
    [row] = Ledger(store, clock).open_rows()
    assert "env:KAGURA_TEST_CF_ROOT is not set" in (row.last_error or "")


def test_non_revocable_orphans_lapse_then_close_as_expired(
    store: StateStore, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    gcp = FakeGcp().start()
    try:
        monkeypatch.setenv("KAGURA_TEST_GCP_TOKEN", "ya29.caller-canary-0000000000000000")
        gcp.caller_tokens.add("ya29.caller-canary-0000000000000000")
        entry: dict[str, Any] = {
            "name": "gcp-deployer",
            "provider": "gcp-main",
            "type": "gcp",
            "scope": "deployer",
            "scope_spec": {
                "service_account": "deployer@p.iam.gserviceaccount.com",
                "scopes": ["https://www.googleapis.com/auth/devstorage.read_only"],
                "endpoint": gcp.url,
                **LOCAL,
            },
            "ttl_seconds": 900,
            "renewals": 0,
            "budget_seconds": 900,
            "secret_ref": "env:KAGURA_TEST_GCP_TOKEN",
            "standing": False,
            "class": "baseline",
        }
        Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
        orphan(store)
        sweeper = Sweeper(store, clock=clock)
        assert len(sweeper.sweep().lapsing) == 1
        # The fake stamps the expiry from the wall clock at the mint, which a loaded
        # machine reaches seconds after this test's clock started: a minute's margin.
        clock.advance(timedelta(seconds=960))
        assert len(sweeper.sweep().expired) == 1
        assert Ledger(store, clock).open_rows() == []
    finally:
        gcp.stop()
