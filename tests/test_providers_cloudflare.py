"""cloudflare through the real cloudflare SDK against the local fake."""

from __future__ import annotations

import httpx
import pytest

from kagura_agent.errors import UsageError
from kagura_agent.membrane.providers import ProviderError, build_provider
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare

POLICY = {
    "effect": "allow",
    "permission_groups": [{"id": "c8fed203ed3043cba015a93ad1616f1f"}],
    "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
}


def settings(fake: FakeCloudflare) -> dict[str, object]:
    return {"endpoint": fake.url + "/client/v4", "max_retries": 0}


def verify(fake: FakeCloudflare, token: str) -> int:
    response = httpx.get(
        fake.url + "/client/v4/user/tokens/verify", headers={"Authorization": f"Bearer {token}"}
    )
    return response.status_code


def test_mint_with_exact_policies_then_revoke(cloudflare: FakeCloudflare) -> None:
    provider = build_provider("cloudflare", settings(cloudflare), ROOT_TOKEN)
    assert provider.revocable
    minted = provider.mint({"policies": [POLICY]}, 900, "g-1")
    [mint] = cloudflare.ops("mint")
    assert mint["policies"] == [POLICY] and mint["name"] == "kagura-g-1"
    token = minted.bundle.files["cloudflare/token"]
    assert verify(cloudflare, token) == 200
    assert provider.find("g-1") == [minted.id] and provider.find("g-2") == []
    assert provider.revoke(minted.id) is True
    assert cloudflare.ops("revoke") == [{"op": "revoke", "id": minted.id, "name": "kagura-g-1"}]
    assert verify(cloudflare, token) == 401
    with pytest.raises(ProviderError) as caught:
        provider.revoke(minted.id)
    assert caught.value.gone


DENY = {
    "effect": "deny",
    "permission_groups": [{"id": "82e64a83756745bbbb1c9c2701bf816b"}],
    "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
}


@pytest.mark.parametrize(
    "misbehaviour",
    [
        {"overgrant_policies": [{**POLICY, "resources": {"com.cloudflare.api.account.*": "*"}}]},
        {
            "overgrant_policies": [
                {**POLICY, "permission_groups": [{"id": "e086da7e2179491d91ee5f35b3ca210a"}]}
            ]
        },
        {"ignore_expiry": True},  # a token that never expires
        {"later_expiry_seconds": 3600},
    ],
)
def test_a_token_wider_or_longer_than_asked_is_revoked_and_refused(
    cloudflare: FakeCloudflare, misbehaviour: dict[str, object]
) -> None:
    """Whatever the API answers, no token with more policies than the scope's, or living
    past the lease, leaves the provider: it is deleted at once."""
    for key, value in misbehaviour.items():
        setattr(cloudflare, key, value)
    provider = build_provider("cloudflare", settings(cloudflare), ROOT_TOKEN)
    with pytest.raises(ProviderError, match="wider than asked") as caught:
        provider.mint({"policies": [POLICY]}, 900, "g-1")
    assert not caught.value.transient
    assert len(cloudflare.ops("mint")) == 1 and len(cloudflare.ops("revoke")) == 1
    assert cloudflare.live_tokens() == []


def test_a_token_missing_an_asked_deny_is_revoked_and_refused(
    cloudflare: FakeCloudflare,
) -> None:
    cloudflare.drop_deny_policies = True
    provider = build_provider("cloudflare", settings(cloudflare), ROOT_TOKEN)
    with pytest.raises(ProviderError, match="wider than asked"):
        provider.mint({"policies": [POLICY, DENY]}, 900, "g-1")
    assert cloudflare.live_tokens() == []


def test_a_token_exactly_as_asked_is_kept(cloudflare: FakeCloudflare) -> None:
    provider = build_provider("cloudflare", settings(cloudflare), ROOT_TOKEN)
    minted = provider.mint({"policies": [DENY, POLICY]}, 900, "g-1")
    assert [t["id"] for t in cloudflare.live_tokens()] == [minted.id]


@pytest.mark.parametrize(("status", "transient"), [(429, True), (500, True), (403, False)])
def test_failures_are_classified(cloudflare: FakeCloudflare, status: int, transient: bool) -> None:
    provider = build_provider("cloudflare", settings(cloudflare), ROOT_TOKEN)
    cloudflare.fail("POST", "/client/v4/user/tokens", status)
    with pytest.raises(ProviderError) as caught:
        provider.mint({"policies": [POLICY]}, 900, "g-1")
    assert caught.value.transient is transient


def test_wrong_root_token_and_unreachable_api(cloudflare: FakeCloudflare) -> None:
    with pytest.raises(ProviderError, match="403"):
        build_provider("cloudflare", settings(cloudflare), "wrong").mint(
            {"policies": [POLICY]}, 900, "g-1"
        )
    down = build_provider(
        "cloudflare", {"endpoint": "http://127.0.0.1:9", "max_retries": 0}, ROOT_TOKEN
    )
    with pytest.raises(ProviderError) as caught:
        down.mint({"policies": [POLICY]}, 900, "g-1")
    assert caught.value.transient


def test_scope_without_policies_is_a_usage_error(cloudflare: FakeCloudflare) -> None:
    provider = build_provider("cloudflare", settings(cloudflare), ROOT_TOKEN)
    with pytest.raises(UsageError):
        provider.mint({}, 900, "g-1")
