"""The brain's credential at the proxy (apply/midrun/injected.py): what the port is given for each
endpoint, what the CLI is told instead, and a leased credential renewed into the proxy.

The lease is a real AWS STS one (boto3 against moto_server), on a clock the test moves:
each renewal replaces the credential the proxy injects with the new key moto issued;
when the lease's budget is spent the proxy holds none and the run is stopped.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from golden import golden_plan

from kagura_agent.apply.midrun.injected import (
    WITHDRAWN,
    injection_of,
    keep_injected_fresh,
    proxy_secret,
)
from kagura_agent.clock import FixedClock
from kagura_agent.membrane.leases import Broker, LeaseRequest
from kagura_agent.state import open_store
from testing.moto import moto_server

ROOT = "AKIAINJECTEDTEST0001:injected/root/" + "w" * 26


def test_each_endpoint_gives_the_port_its_upstream_and_the_cli_only_switches() -> None:
    bedrock, environment = injection_of(golden_plan("sdk-bedrock"))
    assert (bedrock.host, bedrock.api, bedrock.auth, bedrock.region) == (
        "bedrock-runtime.us-east-1.amazonaws.com",
        "bedrock",
        "sigv4",
        "us-east-1",
    )
    assert environment == {
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "AWS_REGION": "us-east-1",
        "ANTHROPIC_BEDROCK_BASE_URL": "http://127.0.0.1:3129",
        "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1",
    }
    vertex, environment = injection_of(golden_plan("sdk-vertex"))
    assert (vertex.host, vertex.auth, vertex.project) == (
        "us-east5-aiplatform.googleapis.com",
        "bearer",
        "kagura-models",
    )
    assert environment["ANTHROPIC_VERTEX_BASE_URL"] == "http://127.0.0.1:3129/v1"
    assert environment["CLAUDE_CODE_SKIP_VERTEX_AUTH"] == "1"
    gateway, environment = injection_of(golden_plan("sdk-gateway"))
    assert (gateway.host, gateway.port, gateway.base_path, gateway.header) == (
        "llm-gateway.corp.example",
        4000,
        "/anthropic",
        "authorization",
    )
    assert environment["ANTHROPIC_API_KEY"] == "injected-at-the-proxy"
    subscription, environment = injection_of(golden_plan("sdk-subscription"))
    assert (subscription.host, subscription.auth) == ("api.anthropic.com", "oauth")
    # A subscriber's CLI: an OAuth token (a placeholder), and no API key that would win.
    assert environment["CLAUDE_CODE_OAUTH_TOKEN"] == "injected-at-the-proxy"
    assert "ANTHROPIC_API_KEY" not in environment


class Proxy:
    """The run's proxy as the keeper sees it: what it was told to inject, in order. With a
    clock, the run goes on past each renewal to the renewed credential's end."""

    def __init__(self, clock: FixedClock | None = None) -> None:
        self.secrets: list[str] = []
        self._clock = clock

    def renew_credential(self, secret: str) -> None:
        self.secrets.append(secret)
        if self._clock is not None and secret != WITHDRAWN:
            self._clock.advance(timedelta(minutes=15))


@pytest.fixture()
def moto() -> Iterator[str]:
    with moto_server() as url:
        yield url


def _issued(moto: str) -> list[str]:
    with urllib.request.urlopen(moto + "/moto-api/data.json", timeout=10) as response:
        roles = json.load(response)["sts"]["AssumedRole"]
    return [f"{r['access_key_id']}:{r['secret_access_key']}:{r['session_token']}" for r in roles]


def test_a_renewed_sts_lease_replaces_the_proxys_key_and_a_spent_one_stops_the_run(
    moto: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_AWS_ROOT_KEY", ROOT)
    plan = golden_plan("sdk-bedrock")
    (entry,) = plan["credentials"]
    entry = {
        **entry,
        "scope_spec": {
            **entry["scope_spec"],
            "endpoint": moto,
            "endpoint_addresses": ["127.0.0.1/32"],
        },
        "renewals": 1,
        "budget_seconds": 1800,
    }
    clock = FixedClock(datetime.now(UTC))
    lease = Broker(open_store(), clock=clock).acquire(LeaseRequest.from_plan(entry))
    first = proxy_secret(lease)
    proxy = Proxy(clock)
    stopped: list[str] = []

    async def stop(why: str) -> None:
        stopped.append(why)

    # The first credential is due (11 of its 15 minutes gone): the first tick renews it
    # into the proxy. The renewed one is the last the budget allows, held to its end; the
    # run goes on to that end (the proxy moves the clock), and the next tick finds the
    # budget spent: the proxy withdrawn, the run stopped.
    clock.advance(timedelta(minutes=11))
    asyncio.run(
        keep_injected_fresh(proxy, [lease], stop, margin=timedelta(hours=1), poll_seconds=0)
    )
    issued = _issued(moto)
    assert first == issued[0] and len(issued) == 2
    assert proxy.secrets == [issued[1], WITHDRAWN]
    assert stopped and "budget" in stopped[0]


def test_a_standing_key_is_held_for_the_run_not_renewed_in_the_proxy(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_KEY", "sk-gateway-standing-" + "s" * 24)
    (entry,) = golden_plan("sdk-gateway")["credentials"]
    clock = FixedClock(datetime.now(UTC))
    lease = Broker(open_store(), clock=clock).acquire(LeaseRequest.from_plan(entry))
    assert proxy_secret(lease) == "sk-gateway-standing-" + "s" * 24
    proxy = Proxy()

    async def never(why: str) -> None:
        raise AssertionError(why)

    clock.advance(timedelta(hours=2))  # past its lease: a standing key is not ticked here
    asyncio.run(keep_injected_fresh(proxy, [lease], never, poll_seconds=0))
    assert proxy.secrets == []
