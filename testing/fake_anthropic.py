"""A fake Anthropic API in a container, for the proxy's credential injection.

The run's proxy reaches it as a reverse proxy (membrane/egress/squid.Injection) over plain
HTTP on a test network the proxy joins before squid starts (squid resolves and probes its
peer at start). It answers every POST with a small JSON message and prints one line per
request: ``KEYS <the x-api-key values as JSON> <path>``, so a test sees which key arrived.

``FakeAnthropicRuntime`` is apply's Docker runtime with the run's injection pointed here
instead of api.anthropic.com (nothing else changes): tests pass it to ``apply_plan``. It
takes any fake API container on its own network (``Upstream``): this one, or
testing/fake_messages_api.py's scripted Messages API that the real Claude Code CLI talks to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kagura_agent.apply.run.context import EgressSink
from kagura_agent.apply.run.docker import DockerApplyRuntime
from kagura_agent.clock import Clock
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.request import EgressRequest
from kagura_agent.membrane.egress.session import EgressSession
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

HOST = "api.anthropic.test"
PORT = 8080
SCRIPT = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        keys = self.headers.get_all("x-api-key") or []
        print("KEYS", json.dumps(keys), self.path, flush=True)
        out = json.dumps({"type": "message", "seen": len(body)}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out)))
        self.end_headers(); self.wfile.write(out)
    def log_message(self, *args): pass
print("ready", flush=True)
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""


class Upstream(Protocol):
    """A fake API in a container: its network (the proxy joins it), address and port."""

    @property
    def network(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def dns(self) -> bool:
        """Whether it answers DNS (a sealed proxy then resolves through it)."""
        ...


@dataclass(frozen=True)
class FakeAnthropic:
    container: Any
    network: str
    address: str
    port: int = PORT
    dns: bool = False

    def requests(self) -> list[str]:
        """The ``KEYS ...`` line of every request it received, in order."""
        text = self.container.logs().decode(errors="replace")
        return [line for line in text.splitlines() if line.startswith("KEYS ")]


@contextlib.contextmanager
def fake_anthropic(client: Any, image: str, labels: dict[str, str]) -> Iterator[FakeAnthropic]:
    """The fake API on its own network, ready; removed with its network on exit."""
    network = client.networks.create(
        f"kagura-test-anthropic-{time.monotonic_ns()}", labels=labels, internal=True
    )
    container = None
    try:
        container = client.containers.run(
            image, ["python3", "-c", SCRIPT], detach=True, labels=labels, network=network.name
        )
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        deadline = time.monotonic() + 15
        while "ready" not in container.logs().decode():
            if time.monotonic() > deadline:
                raise TimeoutError("the fake Anthropic API never printed ready")
            time.sleep(0.05)
        yield FakeAnthropic(container, network.name, address)
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


class FakeAnthropicRuntime(DockerApplyRuntime):
    """apply's Docker runtime; a run's injection goes to ``fake`` (plain HTTP), and the
    run's proxy gets no route off this machine: its outbound network is internal, so what
    the agent (or the real Claude Code CLI on its own) sends to a host its allowlist names
    ends at the proxy as it would where the host does not resolve, never on the Internet."""

    def __init__(self, fake: Upstream, client: Any = None, *, owner_key: str = "") -> None:
        super().__init__(client, owner_key=owner_key)
        self.fake = fake

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
        if injection is not None:
            injection = dataclasses.replace(injection, host=HOST, port=self.fake.port, tls=False)
        resolver = self.fake.address if self.fake.dns else None
        request = EgressRequest.for_run(
            plan, run_id, injection=injection, injection_secret=injection_secret, scrub=scrub
        )
        request = dataclasses.replace(
            request, extra_hosts={HOST: self.fake.address}, extra_networks=(self.fake.network,)
        )
        return EgressSession.start(
            _Sealed(self.client, resolver), request, on_event, store=store, clock=clock
        )


class _Sealed:
    """A Docker client whose new networks are internal (no route off the machine) and whose
    new containers resolve names through ``resolver`` (the fake's NXDOMAIN server) when
    given: Docker's resolver never answers a name off an internal network, so squid would
    wait out its DNS timeout, and a tunnel the real CLI opens to a host would end in the
    proxy's log only after the run (never, once the proxy is removed)."""

    def __init__(self, client: Any, resolver: str | None = None) -> None:
        self._client = client
        self._resolver = resolver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @property
    def networks(self) -> Any:
        return _SealedNetworks(self._client.networks)

    @property
    def containers(self) -> Any:
        return _ResolvingContainers(self._client.containers, self._resolver)


class _ResolvingContainers:
    def __init__(self, containers: Any, resolver: str | None) -> None:
        self._containers = containers
        self._resolver = resolver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._containers, name)

    def create(self, image: str, *args: Any, **kwargs: Any) -> Any:
        if self._resolver is not None:
            kwargs["dns"] = [self._resolver]
        return self._containers.create(image, *args, **kwargs)


class _SealedNetworks:
    def __init__(self, networks: Any) -> None:
        self._networks = networks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._networks, name)

    def create(self, name: str, **kwargs: Any) -> Any:
        return self._networks.create(name, **{**kwargs, "internal": True})


# --- every apply of a test's processes, children included --------------------------------

# JSON {"network", "address", "port"} of a fake upstream: testing/route/sitecustomize.py
# routes every apply of a process that has it (and of the children it starts) there.
ROUTE_ENV = "KAGURA_TEST_MODEL_UPSTREAM"
ROUTE_DIR = Path(__file__).resolve().parent / "route"


@dataclass(frozen=True)
class Route:
    network: str
    address: str
    port: int
    dns: bool = False
    # A brain's model endpoint (testing/fake_endpoint_runtime.py): the fake providers'
    # container, and where the credentials it trusts are issued.
    container: str = ""
    trust_from: dict[str, str] = field(default_factory=dict)
    endpoint: bool = False


def route_env(fake: Upstream) -> dict[str, str]:
    """The environment that makes ``kagura-agent`` processes (``apply``, and the child
    applies a dispatch starts) send the run's model calls to ``fake``."""
    route = {"network": fake.network, "address": fake.address, "port": fake.port, "dns": fake.dns}
    path = os.pathsep.join([str(ROUTE_DIR), str(ROUTE_DIR.parents[1])])
    return {ROUTE_ENV: json.dumps(route), "PYTHONPATH": path}


def route_from_env() -> None:
    """Give apply (and the team runner) FakeAnthropicRuntime instead of Docker's runtime
    when ROUTE_ENV is set (called from testing/route/sitecustomize.py)."""
    raw = os.environ.get(ROUTE_ENV)
    if not raw:
        return
    from kagura_agent import hostproc
    from kagura_agent.apply.run import executor

    fake = Route(**json.loads(raw))
    runtime: Any = FakeAnthropicRuntime
    if fake.endpoint:
        from testing.fake_endpoint_runtime import FakeEndpointRuntime

        runtime = FakeEndpointRuntime
    executor.DockerApplyRuntime = functools.partial(runtime, fake)  # type: ignore[attr-defined]
    # The processes kagura starts run isolated (python -I ignores PYTHONPATH, so this
    # sitecustomize would not reach them): their start code routes them the same way.
    start = (
        f"import sys\nsys.path.insert(0, {str(ROUTE_DIR.parents[1])!r})\n"
        "from testing.fake_anthropic import route_from_env\nroute_from_env()\n"
    )
    isolated = hostproc.python_code_argv

    def routed(source: str, *args: str, python: str | None = None) -> list[str]:
        return isolated(start + source, *args, python=python)

    hostproc.python_code_argv = routed
