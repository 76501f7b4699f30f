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
