"""Which credentials are revocable and which only lapse, said per provider type the same
way by the traits table, the ledger, the plan and docs/credentials.md.

(STS through the broker and ``leases list``: tests/test_providers_aws.py.)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger
from kagura_agent.membrane.providers.traits import TRAITS, release_says
from kagura_agent.plan.render import _cred_line
from kagura_agent.state import open_store

REPO = Path(__file__).resolve().parent.parent
KINDS_TABLE = re.compile(r"^\| `([a-z-]+)` \| ((?:`[a-z-]+`(?:, )?)+) \|", re.M)


def test_the_docs_say_per_provider_type_how_its_credentials_end() -> None:
    text = (REPO / "docs" / "credentials.md").read_text()
    said: dict[str, str] = {}
    for kind, types in KINDS_TABLE.findall(text):
        for name in re.findall(r"`([a-z-]+)`", types):
            said[name] = kind
    assert said == {name: traits.release for name, traits in TRAITS.items()}


def test_the_plan_line_says_whether_a_credential_can_be_revoked() -> None:
    def line(kind: str) -> str:
        cred: Any = {
            "provider": "p",
            "scope": "s",
            "type": kind,
            "secret_ref": "env:X",
            "ttl_seconds": 900,
            "renewals": 0,
            "budget_seconds": 900,
            "standing": kind == "static",
            "scope_spec": {"x": 1},
            "category": "credential:p/s",
        }
        return _cred_line(cred)

    assert line("aws-sts").endswith("; NOT revocable: lapses at its expiry")
    assert line("cloudflare").endswith("; revoked at release")
    assert line("gcp").endswith("; revoked at release (lapses if the run crashes)")
    assert line("github-app").endswith("; revoked at release (lapses if the run crashes)")
    assert line("static").endswith("; never revoked, never lapses")


def test_a_standing_secret_is_released_as_standing_not_as_lapsing(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_TOKEN", "standing-canary")
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    entry: dict[str, Any] = {
        "name": "token",
        "provider": "token",
        "type": "static",
        "scope": "use",
        "scope_spec": {"env": "TEST_TOKEN"},
        "ttl_seconds": 900,
        "renewals": 0,
        "budget_seconds": 900,
        "secret_ref": "env:KAGURA_TEST_TOKEN",
        "standing": True,
        "class": "baseline",
    }
    lease = Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
    lease.release()
    ledger = Ledger(store, clock)
    (row,) = ledger.rows()
    assert (row.state, row.release_kind) == ("released", "standing")
    assert "never revoked, never lapses" in (row.note or "")
    assert row.to_json()["revocable"] is False
    assert ledger.rows(include_closed=False) == []
    store.close()


def test_a_row_of_an_unknown_kind_says_so() -> None:
    assert "not known" in release_says("teleported")
    assert release_says("lapses", "2030-01-01T00:00:00Z") == (
        "cannot be revoked: lapses at 2030-01-01T00:00:00Z"
    )
