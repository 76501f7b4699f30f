"""github-app through httpx + PyJWT against a fake that verifies the app JWT."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger
from kagura_agent.membrane.providers import ProviderError, build_provider
from kagura_agent.state import open_store
from testing.fake_github import FakeGithub
from testing.keys import rsa_pair


@pytest.fixture()
def github() -> Iterator[FakeGithub]:
    fake = FakeGithub().start()
    fake.add_app(
        "4242",
        rsa_pair("github")[1],
        77,
        ["site", "infra"],
        {"contents": "write", "issues": "write"},
    )
    yield fake
    fake.stop()


READ_SITE = {"repositories": ["site"], "permissions": {"contents": "read"}}


def settings(fake: FakeGithub) -> dict[str, object]:
    return {
        "endpoint": fake.url,
        "endpoint_addresses": ["127.0.0.1/32"],
        "app_id": "4242",
        "installation_id": 77,
    }


def test_token_is_limited_to_listed_repositories_and_permissions(github: FakeGithub) -> None:
    provider = build_provider("github-app", settings(github), rsa_pair("github")[0])
    minted = provider.mint(
        {"repositories": ["site"], "permissions": {"contents": "read"}}, 900, "g-1"
    )
    [mint] = github.ops("mint")
    assert mint["repositories"] == ["site"] and mint["permissions"] == {"contents": "read"}
    token = minted.bundle.files["github/token"]
    assert token.startswith("ghs_") and minted.bundle.env["GH_TOKEN"] == token
    repos = httpx.get(
        github.url + "/installation/repositories", headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert [r["name"] for r in repos["repositories"]] == ["site"]
    assert provider.revoke(minted.id) is True
    assert len(github.ops("revoke")) == 1
    # The revoked token no longer works.
    gone = httpx.get(
        github.url + "/installation/repositories", headers={"Authorization": f"Bearer {token}"}
    )
    assert gone.status_code == 401


@pytest.mark.parametrize(
    "overgrant",
    [
        {"overgrant_permissions": {"contents": "write"}},  # a higher level of an asked one
        {"overgrant_permissions": {"contents": "admin"}},
        {"overgrant_permissions": {"issues": "read"}},  # one never asked for
        {"overgrant_repositories": ["infra"]},  # a repository never asked for
        {"overgrant_all": True},  # every repository of the installation
    ],
)
def test_a_token_wider_than_asked_is_revoked_and_refused(
    github: FakeGithub, overgrant: dict[str, object]
) -> None:
    """Whatever GitHub answers, no token wider than the scope leaves the provider: a
    grant above the asked level or outside the asked repositories is revoked at once."""
    for key, value in overgrant.items():
        setattr(github, key, value)
    provider = build_provider("github-app", settings(github), rsa_pair("github")[0])
    with pytest.raises(ProviderError, match="wider than asked") as caught:
        provider.mint({"repositories": ["site"], "permissions": {"contents": "read"}}, 900, "g-1")
    assert not caught.value.transient
    assert len(github.ops("mint")) == 1 and len(github.ops("revoke")) == 1
    assert github.tokens == {}  # the one minted no longer works


def test_a_token_exactly_as_asked_is_kept(github: FakeGithub) -> None:
    github.overgrant_permissions = {"metadata": "read"}  # GitHub always adds it
    provider = build_provider("github-app", settings(github), rsa_pair("github")[0])
    minted = provider.mint(
        {"repositories": ["site"], "permissions": {"contents": "write"}}, 900, "g-1"
    )
    assert github.ops("revoke") == [] and minted.bundle.files["github/token"] in github.tokens


def test_a_wrong_key_is_refused(github: FakeGithub) -> None:
    provider = build_provider("github-app", settings(github), rsa_pair("other")[0])
    with pytest.raises(ProviderError) as caught:
        provider.mint(READ_SITE, 900, "g-1")
    assert "401" in str(caught.value) and not caught.value.transient
    with pytest.raises(UsageError, match="not a usable RSA private key"):
        build_provider("github-app", settings(github), "not-a-key").mint(READ_SITE, 900, "g-2")


def test_repositories_outside_the_installation_are_refused(github: FakeGithub) -> None:
    provider = build_provider("github-app", settings(github), rsa_pair("github")[0])
    with pytest.raises(ProviderError, match="422"):
        provider.mint(
            {"repositories": ["secret-repo"], "permissions": {"contents": "read"}}, 900, "g-1"
        )
    assert github.ops("mint") == []


@pytest.mark.parametrize(
    "spec",
    [{}, {"repositories": ["site"]}, {"permissions": {"contents": "read"}}],
)
def test_a_scope_without_permissions_or_repositories_is_not_minted(
    github: FakeGithub, spec: dict[str, object]
) -> None:
    """No permissions (or no repositories) meant the installation's all: never by omission;
    full_access: true asks GitHub for the installation's token on the operator's word."""
    provider = build_provider("github-app", settings(github), rsa_pair("github")[0])
    with pytest.raises(RefusedError, match="narrows nothing"):
        provider.mint(spec, 900, "g-wide")
    assert github.ops("mint") == []
    provider.mint({"full_access": True}, 900, "g-full")
    [mint] = github.ops("mint")
    assert mint["permissions"] == {"contents": "write", "issues": "write"}  # the installation's


def test_broker_mint_renew_revoke(
    github: FakeGithub, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_GH_KEY", rsa_pair("github")[0])
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    entry = {
        "name": "gh-site",
        "provider": "github-main",
        "type": "github-app",
        "scope": "site-read",
        "scope_spec": {
            **settings(github),
            "repositories": ["site"],
            "permissions": {"contents": "read"},
        },
        "ttl_seconds": 3600,
        "renewals": 2,
        "budget_seconds": 7200,
        "secret_ref": "env:KAGURA_TEST_GH_KEY",
        "standing": False,
        "class": "graduated",
    }
    lease = Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
    clock.advance(timedelta(minutes=56))
    assert lease.tick() is not None
    lease.release()
    assert len(github.ops("mint")) == 2 and len(github.ops("revoke")) == 2
    assert github.tokens == {}
    assert {r.state for r in Ledger(store, clock).rows()} == {"released"}
    store.close()
