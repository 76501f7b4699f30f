"""The broker against the Cloudflare fake: default deny, budgets, renewal, fail closed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.errors import ExitCode, RefusedError, SetupError
from kagura_agent.membrane.leases import Broker, Budget, LeaseRequest, Ledger
from kagura_agent.membrane.providers import Bundle, Minted
from kagura_agent.state import StateStore, open_store
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")

# The fakes listen on loopback: declared as the providers' own address.
LOCAL = {"endpoint_addresses": ["127.0.0.1/32"]}
SCOPE = {
    "permission_groups": ["4755a26eedb94da69e1066d98aa820be"],
    "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
}


@pytest.fixture()
def store(state_dir: Path) -> Iterator[StateStore]:
    db = open_store()
    yield db
    db.close()


@pytest.fixture()
def clock() -> FixedClock:
    return FixedClock(datetime.now(UTC).replace(microsecond=0))


def entry(cloudflare: FakeCloudflare, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
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
        "category": "credential:cloudflare-main/dns-edit",
    }
    base.update(overrides)
    return base


@pytest.fixture()
def broker(store: StateStore, clock: FixedClock, monkeypatch: pytest.MonkeyPatch) -> Broker:
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    return Broker(store, run_id="run-test", clock=clock)


def states(store: StateStore) -> list[str]:
    rows = Ledger(store, FixedClock(datetime.now(UTC))).rows()
    return sorted(row.state for row in rows)


def test_acquire_mints_exactly_the_scope_and_records_the_ledger(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore, clock: FixedClock
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    [mint] = cloudflare.ops("mint")
    assert mint["policies"] == [
        {
            "effect": "allow",
            "permission_groups": [{"id": SCOPE["permission_groups"][0]}],
            "resources": SCOPE["resources"],
        }
    ]
    assert mint["name"] == f"kagura-{lease.grant}"
    expires = datetime.fromisoformat(mint["expires_on"].replace("Z", "+00:00"))
    assert timedelta(seconds=850) < expires - clock.now() <= timedelta(seconds=905)
    token = lease.bundle.files["cloudflare/token"]
    assert lease.bundle.env["CLOUDFLARE_API_TOKEN"] == token
    [row] = Ledger(store, clock).rows()
    assert (row.state, row.minted_id, row.run_id) == ("live", mint["id"], "run-test")
    assert row.expires_at == expires


def test_tick_renews_before_expiry_and_revokes_the_old_credential(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore, clock: FixedClock
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    first = lease.bundle.files["cloudflare/token"]
    assert lease.tick() is None  # not yet due
    clock.advance(timedelta(minutes=11))  # 4 minutes left: inside the 5-minute margin
    renewed = lease.tick()
    assert renewed is not None and lease.renewals_used == 1
    assert renewed.bundle.files["cloudflare/token"] != first
    mints = cloudflare.ops("mint")
    assert len(mints) == 2
    assert [e["id"] for e in cloudflare.ops("revoke")] == [mints[0]["id"]]
    assert states(store) == ["live", "released"]
    lease.release()
    assert [e["id"] for e in cloudflare.ops("revoke")] == [m["id"] for m in mints]
    assert states(store) == ["released", "released"]
    assert cloudflare.live_tokens() == []


def test_renewals_exhausted_fails_closed_with_exit_6(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare, renewals=1)))
    lease.renew()
    with pytest.raises(RefusedError) as caught:
        lease.renew()
    assert caught.value.exit_code == ExitCode.REFUSED == 6
    assert "budget exhausted" in caught.value.message and "1 renewals" in caught.value.message
    # Fail closed: nothing stays live, and the lease no longer hands out a bundle.
    assert cloudflare.live_tokens() == []
    assert lease.closed
    with pytest.raises(RefusedError):
        _ = lease.bundle
    assert "live" not in states(store)


def test_budget_seconds_exhausted_fails_closed(
    broker: Broker, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    lease = broker.acquire(
        LeaseRequest.from_plan(entry(cloudflare, budget_seconds=1200, renewals=5))
    )
    clock.advance(timedelta(seconds=1170))  # 30 s of budget left: under any useful lease
    with pytest.raises(RefusedError, match="budget exhausted"):
        lease.tick()
    assert cloudflare.live_tokens() == []


def test_a_short_lease_is_held_to_its_budget_not_cut_by_the_renewal_margin(
    broker: Broker, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    """A 2-minute budget (a resumed session's remainder, a sub-agent's share, a short
    grant): before, the 5-minute renewal margin made its only credential due at once and
    the first tick exhausted it; a short credential was renewed on every tick."""
    lease = broker.acquire(
        LeaseRequest.from_plan(entry(cloudflare, budget_seconds=120, renewals=0))
    )
    assert lease.last and lease.held_until == lease.started_at + timedelta(seconds=110)
    clock.advance(timedelta(seconds=5))
    assert lease.tick() is None and not lease.closed
    clock.advance(timedelta(seconds=104))  # 109 s: its last 11 seconds
    assert lease.tick() is None and not lease.closed
    clock.advance(timedelta(seconds=1))
    with pytest.raises(RefusedError, match="its last credential ends"):
        lease.tick()
    assert cloudflare.live_tokens() == []
    # Its budget extended (an operator approved it mid-run): the short credential is
    # renewed a third of its life before it expires, for the rest of the new budget.
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare, budget_seconds=120)))
    first = lease.minted
    lease.budget = Budget(300, 1)
    assert not lease.last and lease.held_until == lease.started_at + timedelta(seconds=290)
    clock.advance(timedelta(seconds=79))
    assert lease.tick() is None  # a 120 s credential: renewed 40 s before its end
    clock.advance(timedelta(seconds=2))
    assert lease.tick() is not None and lease.minted is not first
    assert lease.expires_at == lease.budget_ends_at and lease.last
    lease.release()


def test_lease_never_outlives_its_budget(
    broker: Broker, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    lease = broker.acquire(
        LeaseRequest.from_plan(entry(cloudflare, ttl_seconds=3600, budget_seconds=600))
    )
    assert lease.expires_at <= clock.now() + timedelta(seconds=600)
    [mint] = cloudflare.ops("mint")
    expires = datetime.fromisoformat(mint["expires_on"].replace("Z", "+00:00"))
    assert expires - clock.now() <= timedelta(seconds=605)


def test_explicit_budget_narrower_than_plan_is_honoured(
    broker: Broker, cloudflare: FakeCloudflare
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare)), Budget(3600, 0))
    with pytest.raises(RefusedError, match="all 0 renewals used"):
        lease.renew()


@pytest.mark.parametrize("klass", ["needs-approval", "denied", "unknown"])
def test_default_deny_refuses_and_records(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore, klass: str
) -> None:
    with pytest.raises(RefusedError) as caught:
        broker.acquire(LeaseRequest.from_plan(entry(cloudflare, **{"class": klass})))
    assert caught.value.exit_code == 6
    assert "default deny" in caught.value.message
    assert cloudflare.ops("mint") == []
    [row] = Ledger(store, FixedClock(datetime.now(UTC))).rows()
    assert row.state == "refused" and row.closed_at is not None and row.klass == klass


@pytest.mark.parametrize("klass", ["graduated", "approved"])
def test_graduated_and_approved_are_minted(
    broker: Broker, cloudflare: FakeCloudflare, klass: str
) -> None:
    broker.acquire(LeaseRequest.from_plan(entry(cloudflare, **{"class": klass})))
    assert len(cloudflare.ops("mint")) == 1


def test_static_needs_standing(
    broker: Broker, cloudflare: FakeCloudflare, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_LLM_KEY", "sk-ant-canary-standing-key-0000000000")
    static = entry(
        cloudflare,
        name="anthropic",
        type="static",
        scope_spec={"env": "ANTHROPIC_API_KEY"},
        secret_ref="env:KAGURA_TEST_LLM_KEY",
    )
    with pytest.raises(RefusedError, match="standing: true"):
        broker.acquire(LeaseRequest.from_plan(static))
    lease = broker.acquire(LeaseRequest.from_plan({**static, "standing": True}))
    assert lease.bundle.env == {"ANTHROPIC_API_KEY": "sk-ant-canary-standing-key-0000000000"}
    lease.release()


def test_providers_date_leases_with_the_brokers_clock(
    broker: Broker, cloudflare: FakeCloudflare, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The static provider computes its own expiry: from the injected clock, not the wall."""
    monkeypatch.setenv("KAGURA_TEST_LLM_KEY", "sk-ant-canary-standing-key-0000000000")
    clock.advance(timedelta(days=3))
    static = entry(
        cloudflare,
        name="anthropic",
        type="static",
        scope_spec={"env": "ANTHROPIC_API_KEY"},
        secret_ref="env:KAGURA_TEST_LLM_KEY",
        standing=True,
    )
    lease = broker.acquire(LeaseRequest.from_plan(static))
    assert lease.expires_at == clock.now() + timedelta(seconds=900)
    lease.release()


def test_permanent_mint_failure_closes_the_row(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore
) -> None:
    cloudflare.fail("POST", "/client/v4/user/tokens", 403)
    with pytest.raises(SetupError, match="HTTP 403"):
        broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    assert states(store) == ["failed"]


def test_ambiguous_mint_failure_leaves_intent_for_the_sweeper(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore
) -> None:
    cloudflare.fail("POST", "/client/v4/user/tokens", 503)
    with pytest.raises(SetupError, match="HTTP 503"):
        broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    [row] = Ledger(store, FixedClock(datetime.now(UTC))).open_rows()
    assert row.state == "intent" and row.last_error and "503" in row.last_error


def test_failed_release_stays_open_for_the_sweeper(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 502)
    with pytest.raises(SetupError, match="could not revoke"):
        lease.release()
    [row] = Ledger(store, FixedClock(datetime.now(UTC))).open_rows()
    assert row.state == "live" and row.attempts == 1


def test_failed_renewal_retries_while_valid_then_fails_closed_at_expiry(
    broker: Broker, cloudflare: FakeCloudflare, clock: FixedClock
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare)))
    cloudflare.fail("POST", "/client/v4/user/tokens", 503, count=100)
    clock.advance(timedelta(minutes=11))
    assert lease.tick() is None  # the mint failed, but the credential is still good
    assert not lease.closed and lease.bundle
    assert lease.retries == 1  # counted: the run's cost history records it
    assert lease.tick() is None and lease.retries == 2
    clock.advance(timedelta(minutes=5))  # now past its expiry
    with pytest.raises(RefusedError, match="expired and could not be renewed"):
        lease.tick()
    assert lease.closed and cloudflare.live_tokens() == []


def test_exhaustion_stays_a_refusal_when_the_revoke_fails(
    broker: Broker, cloudflare: FakeCloudflare, store: StateStore
) -> None:
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare, renewals=0)))
    cloudflare.fail("DELETE", "/client/v4/user/tokens/", 503)
    with pytest.raises(RefusedError, match="the sweeper retries"):
        lease.renew()
    [row] = Ledger(store, FixedClock(datetime.now(UTC))).open_rows()
    assert row.state == "live" and row.attempts == 1


class LongLived:
    """A provider whose credentials outlive what was asked (an API ignoring the duration),
    revocable or not."""

    kind = "long-lived"
    min_ttl = 60
    max_ttl = 3600

    def __init__(self, clock: FixedClock, *, revocable: bool, lives: timedelta) -> None:
        self.clock, self.revocable, self.lives = clock, revocable, lives
        self.minted: list[str] = []
        self.revoked: list[str] = []

    def mint(self, scope_spec: Any, ttl_seconds: int, lease_id: str) -> Minted:
        self.minted.append(f"ll-{lease_id}")
        return Minted(
            id=f"ll-{lease_id}",
            expires_at=self.clock.now() + self.lives,
            bundle=Bundle(files={"ll/token": "long-lived-token-0123456789"}),
        )

    def revoke(self, minted_id: str) -> bool:
        if not self.revocable:
            return False
        self.revoked.append(minted_id)
        return True

    def find(self, lease_id: str) -> list[str]:
        return []


@pytest.mark.parametrize("revocable", [True, False])
def test_a_credential_outliving_its_lease_budget_is_never_handed_out(
    store: StateStore, clock: FixedClock, cloudflare: FakeCloudflare, revocable: bool
) -> None:
    """Whatever the provider answers, a credential that would outlive the lease's budget
    is not delivered: revoked where the provider can, else left to lapse, and recorded."""
    provider = LongLived(clock, revocable=revocable, lives=timedelta(hours=12))
    broker = Broker(
        store,
        run_id="run-test",
        clock=clock,
        provider_factory=lambda kind, spec, secret: provider,
        resolver=lambda ref: "root-secret-value-000",
    )
    with pytest.raises(SetupError, match="would outlive its lease budget"):
        broker.acquire(LeaseRequest.from_plan(entry(cloudflare, budget_seconds=3600)))
    assert broker.leases == []
    assert provider.revoked == (provider.minted if revocable else [])
    [row] = Ledger(store, FixedClock(datetime.now(UTC))).rows()
    assert row.closed_at is not None and row.state == "failed"
    assert "outlive" in (row.note or "") and ("lapses at" in (row.note or "")) is not revocable
    # Inside the budget (a little clock skew allowed): handed out as before.
    provider.lives = timedelta(seconds=900 + 30)
    lease = broker.acquire(LeaseRequest.from_plan(entry(cloudflare, budget_seconds=900)))
    assert lease.bundle.files == {"ll/token": "long-lived-token-0123456789"}
