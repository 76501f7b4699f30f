"""apply's Docker runtime for runs whose brain names a model endpoint, in tests.

As testing.fake_anthropic.FakeAnthropicRuntime, the run's proxy has no route off this
machine, and its key-injecting port sends the brain's calls to a fake
(testing/fake_model_providers.py, plain HTTP) — here under the endpoint's own host name,
mapped to the fake in the proxy's /etc/hosts, so the Host header a SigV4 signature
covers is the real one. Before the proxy starts, the fake is told which credentials the
providers' fakes have issued, as Bedrock trusts its STS and Vertex its token service:
moto's assumed roles (``/moto-api/data.json``) and testing.fake_gcp's tokens
(``/_admin/tokens``). The test never hands the fake a leased credential itself: what the
run's proxy injects must be what the provider issued.

``endpoint_route_env(fake, moto=..., gcp=...)`` is the environment that makes
``kagura-agent apply`` (and the children it starts) use this runtime
(testing.fake_anthropic.route_from_env reads it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.request
from collections.abc import Callable
from typing import Any

from kagura_agent.apply.run.context import EgressSink
from kagura_agent.apply.run.docker import DockerApplyRuntime
from kagura_agent.clock import Clock
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.request import EgressRequest
from kagura_agent.membrane.egress.session import EgressSession
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore
from testing.fake_anthropic import ROUTE_DIR, ROUTE_ENV, Route, _Sealed
from testing.fake_model_providers import FakeProvidersContainer, Trust


def issued(trust_from: dict[str, str]) -> Trust:
    """The credentials the providers' fakes issued so far."""
    trust = Trust()
    if "moto" in trust_from:
        with urllib.request.urlopen(trust_from["moto"] + "/moto-api/data.json", timeout=10) as r:
            data = json.load(r)
        for role in (data.get("sts") or {}).get("AssumedRole", []):
            trust.aws[role["access_key_id"]] = [role["secret_access_key"], role["session_token"]]
    if "gcp" in trust_from:
        with urllib.request.urlopen(trust_from["gcp"] + "/_admin/tokens", timeout=10) as r:
            trust.bearer_tokens += json.load(r)["tokens"]
    return trust


class FakeEndpointRuntime(DockerApplyRuntime):
    """apply's Docker runtime; the run's injection goes to the fake providers of
    ``route`` (its container trusting what the providers' fakes issued)."""

    def __init__(self, route: Route, client: Any = None, *, owner_key: str = "") -> None:
        super().__init__(client, owner_key=owner_key)
        self.route = route

    def start_egress(
        self,
        plan: Plan,
        run_id: str,
        on_event: EgressSink,
        *,
        store: StateStore,
        clock: Clock,
        injection: Injection | None,
        injection_secret: str | None,
        scrub: Callable[[str], str] | None = None,
    ) -> EgressSession:
        route = self.route
        hosts: dict[str, str] = {}
        if injection is not None:
            fake = FakeProvidersContainer(
                self.client.containers.get(route.container), route.network, route.address
            )
            fake.trust(issued(route.trust_from))
            injection = dataclasses.replace(injection, port=route.port, tls=False)
            hosts[injection.host] = route.address
        request = EgressRequest.for_run(
            plan, run_id, injection=injection, injection_secret=injection_secret, scrub=scrub
        )
        request = dataclasses.replace(request, extra_hosts=hosts, extra_networks=(route.network,))
        return EgressSession.start(
            _Sealed(self.client), request, on_event, store=store, clock=clock
        )


def endpoint_route_env(
    fake: FakeProvidersContainer, *, moto: str | None = None, gcp: str | None = None
) -> dict[str, str]:
    """The environment that makes ``kagura-agent`` processes run with this runtime."""
    trust_from = {k: v for k, v in (("moto", moto), ("gcp", gcp)) if v}
    route = {
        "network": fake.network,
        "address": fake.address,
        "port": fake.port,
        "container": fake.container.id,
        "trust_from": trust_from,
        "endpoint": True,
    }
    path = os.pathsep.join([str(ROUTE_DIR), str(ROUTE_DIR.parents[1])])
    return {ROUTE_ENV: json.dumps(route), "PYTHONPATH": path}
