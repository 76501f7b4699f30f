"""gcp through the real google-cloud-iam client (REST transport) against a local fake."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger
from kagura_agent.membrane.providers import ProviderError, build_provider
from kagura_agent.state import open_store
from testing.fake_gcp import FakeGcp
from testing.keys import rsa_pair

TARGET = "deployer@proj.iam.gserviceaccount.com"
READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


@pytest.fixture()
def gcp() -> Iterator[FakeGcp]:
    fake = FakeGcp(allowed_accounts=(TARGET,)).start()
    fake.register_key("key-1", rsa_pair("gcp")[1])
    yield fake
    fake.stop()


def service_account_key(fake: FakeGcp) -> str:
    return json.dumps(
        {
            "type": "service_account",
            "project_id": "proj",
            "private_key_id": "key-1",
            "private_key": rsa_pair("gcp")[0],
            "client_email": "kagura-root@proj.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": fake.url + "/token",
        }
    )


def settings(fake: FakeGcp) -> dict[str, Any]:
    return {
        "endpoint": fake.url,
        "revoke_endpoint": fake.url + "/revoke",
        "endpoint_addresses": ["127.0.0.1/32"],
    }


def test_mint_impersonates_with_scopes_and_lifetime_then_revokes(gcp: FakeGcp) -> None:
    provider = build_provider("gcp", settings(gcp), service_account_key(gcp))
    minted = provider.mint({"service_account": TARGET, "scopes": [READ_ONLY]}, 900, "g-1")
    [mint] = gcp.ops("mint")
    assert mint["account"] == TARGET and mint["scope"] == [READ_ONLY]
    assert mint["lifetime"] == 900
    remaining = minted.expires_at - datetime.now(UTC)
    assert timedelta(minutes=14) < remaining <= timedelta(minutes=15)
    token = minted.bundle.files["gcp/access-token"]
    assert minted.bundle.env["GOOGLE_OAUTH_ACCESS_TOKEN"] == token
    assert minted.bundle.env["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"] == (
        "/run/kagura/creds/gcp/access-token"
    )
    assert provider.revoke(minted.id) is True
    assert gcp.ops("revoke") == [{"op": "revoke", "account": TARGET}]
    assert gcp.minted == {}


def test_forbidden_impersonation_is_permanent(gcp: FakeGcp) -> None:
    provider = build_provider("gcp", settings(gcp), service_account_key(gcp))
    with pytest.raises(ProviderError) as caught:
        provider.mint(
            {"service_account": "admin@proj.iam.gserviceaccount.com", "scopes": [READ_ONLY]},
            900,
            "g-1",
        )
    assert not caught.value.transient and "403" in str(caught.value)


def test_server_error_is_transient(gcp: FakeGcp) -> None:
    provider = build_provider("gcp", settings(gcp), service_account_key(gcp))
    gcp.fail("POST", "/v1/projects", 503)
    with pytest.raises(ProviderError) as caught:
        provider.mint({"service_account": TARGET, "scopes": [READ_ONLY]}, 900, "g-1")
    assert caught.value.transient


@pytest.mark.parametrize("scopes", [None, [], [CLOUD_PLATFORM]])
def test_a_scope_without_narrow_oauth_scopes_is_not_minted(
    gcp: FakeGcp, scopes: list[str] | None
) -> None:
    """No scopes meant cloud-platform (everything the account can do): never by omission.
    full_access: true asks for cloud-platform on the operator's word."""
    provider = build_provider("gcp", settings(gcp), service_account_key(gcp))
    spec: dict[str, Any] = {"service_account": TARGET}
    if scopes is not None:
        spec["scopes"] = scopes
    with pytest.raises(RefusedError, match="narrows nothing"):
        provider.mint(spec, 900, "g-wide")
    assert gcp.ops("mint") == []
    provider.mint({"service_account": TARGET, "full_access": True}, 900, "g-full")
    [mint] = gcp.ops("mint")
    assert mint["scope"] == [CLOUD_PLATFORM]


def test_broker_mint_renew_revoke(
    gcp: FakeGcp, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_GCP_KEY", service_account_key(gcp))
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    entry = {
        "name": "gcp-deployer",
        "provider": "gcp-main",
        "type": "gcp",
        "scope": "deployer",
        "scope_spec": {"service_account": TARGET, "scopes": [READ_ONLY], **settings(gcp)},
        "ttl_seconds": 900,
        "renewals": 1,
        "budget_seconds": 1800,
        "secret_ref": "env:KAGURA_TEST_GCP_KEY",
        "standing": False,
        "class": "approved",
    }
    lease = Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
    clock.advance(timedelta(minutes=12))
    assert lease.tick() is not None
    lease.release()
    assert len(gcp.ops("mint")) == 2 and len(gcp.ops("revoke")) == 2
    assert {r.state for r in Ledger(store, clock).rows()} == {"released"}
    store.close()
