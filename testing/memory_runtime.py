"""An in-memory runtime for apply: containers, networks and proxies kept in dicts.

A real implementation of ``kagura_agent.apply.run.context.ApplyRuntime`` (mypy checks it
against the Protocol), so tests drive apply's whole sequence — leases, egress, the agent
container, the brain channel, verify, record, clean-up — in a fraction of a second and
without Docker. What Docker and the container would do is scripted:

* the agent's brain (:class:`BrainScript`): the events it sends once it gets its turn,
  the egress decisions its proxy reports meanwhile, whether it crashes (its output ends
  without a terminal event) and the exit code its container ends with;
* verify: each command's exit code and output (``verify``; 0 and no output otherwise);
* failures: ``fail_at[point] = exception`` raises once when apply reaches that point
  (``create:agent``, ``create:verify``, ``start:agent``, ``start:verify``, ``attach``,
  ``start_egress``, ``start_forwarder``, ``exec``, ``turn``, ``credentials``, ``stop``,
  ``remove:agent``, ``remove:verify``, ``egress_close``), a ``KaguraError`` or
  ``KeyboardInterrupt`` alike.

The brain end speaks the entrypoint's side of the channel protocol (credentials and
revocations acknowledged, the turn answered with the scripted events, ``stop`` ends the
output), so the host's BrainChannel runs unchanged over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kagura_agent.apply.run.context import ContainerState, EgressSink
from kagura_agent.brain.events import BrainEvent, DoneEvent, event_to_json
from kagura_agent.brain.streams import DuplexStream, StreamClosed
from kagura_agent.clock import Clock
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.session import AgentNetworkConfig
from kagura_agent.membrane.hardening import LABEL_ROLE, LABEL_RUN
from kagura_agent.membrane.runtime import ContainerError
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

_POLL_SECONDS = 0.002


@dataclass
class BrainScript:
    """What the agent container's brain does once it gets its turn."""

    events: list[BrainEvent] = field(default_factory=lambda: [DoneEvent(result="done")])
    egress: list[dict[str, object]] = field(default_factory=list)  # proxy decisions
    crash: bool = False  # the output ends after ``events``, no terminal event needed
    exit_code: int = 0
    # What the agent does to the world when its turn arrives (writes to the project root).
    on_turn: Callable[[], None] | None = None


@dataclass
class MemoryContainer:
    id: str
    run_id: str
    role: str
    labels: dict[str, str]
    environment: dict[str, str]
    network: str | None
    mounts: list[dict[str, object]]
    status: str = "created"  # created | running | exited
    exit_code: int | None = None
    # lease id -> bundle, delivered over the channel and not revoked
    credentials: dict[str, dict[str, object]] = field(default_factory=dict)
    delivered: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    turns: list[dict[str, object]] = field(default_factory=list)
    stream: _BrainEnd | None = None


class MemoryEgress:
    """One run's proxy, outbound network and socket volume, as dict entries."""

    def __init__(
        self,
        runtime: MemoryRuntime,
        run_id: str,
        on_event: EgressSink,
        injection: Injection | None = None,
        injection_secret: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.run_id = run_id
        self.on_event = on_event
        # What the proxy would add to the brain's API calls (the key never goes inside).
        self.injection = injection
        self.injection_secret = injection_secret
        self.network = f"kagura-egress-{run_id}-outbound"
        self.volume = f"kagura-egress-{run_id}-socket"
        self.proxy = runtime._add(run_id, "proxy", {}, self.network, [])
        self.proxy.status = "running"
        runtime.networks[self.network] = {LABEL_RUN: run_id}
        runtime.volumes[self.volume] = {LABEL_RUN: run_id}
        self.events: list[dict[str, object]] = []
        self.reloads: list[dict[str, Any]] = []
        self.call_limits: list[int | None] = []
        self.credentials: list[str] = []  # renewals of the injected credential
        self.closed = False

    def agent_network_config(self) -> AgentNetworkConfig:
        url = "http://127.0.0.1:3128"
        return AgentNetworkConfig(
            volume=self.volume,
            proxy_url=url,
            socket_path="/run/kagura/egress/proxy.sock",
            port=3128,
            environment={"HTTP_PROXY": url, "HTTPS_PROXY": url},
        )

    def limit_model_calls(self, turns: int | None) -> None:
        """A turn budget extended mid-run (the real proxy's caps follow it)."""
        self.call_limits.append(turns)

    def renew_credential(self, secret: str) -> None:
        """A renewed lease of the injected credential (the real proxy's key file)."""
        self.credentials.append(secret)

    def decide(self, event: dict[str, object]) -> None:
        """The proxy reports one decision (as EgressSession's collector thread does)."""
        decision = {"type": "egress.decision", **event}
        self.events.append(decision)
        self.on_event(decision)

    def denial_summary(self) -> list[dict[str, object]]:
        counts: dict[tuple[object, object], int] = {}
        for event in self.events:
            if event.get("decision") == "deny":
                key = (event.get("host"), event.get("port"))
                counts[key] = counts.get(key, 0) + 1
        return [{"host": h, "port": p, "count": n} for (h, p), n in counts.items()]

    def drain(self) -> None:
        """Nothing lags here: ``decide`` reports each decision as it is made."""

    def reload(self, egress: dict[str, Any]) -> None:
        """A mid-run grant: the allowlist in force from now on (kept for tests to read)."""
        self.runtime._point("egress_reload")
        self.reloads.append(egress)

    def close(self) -> None:
        self.runtime._point("egress_close")
        if self.closed:
            return
        self.closed = True
        self.runtime.containers.pop(self.proxy.id, None)
        self.runtime.networks.pop(self.network, None)
        self.runtime.volumes.pop(self.volume, None)
        self.runtime.log.append(("egress_close", self.run_id))


class MemoryRuntime:
    """Containers, networks and volumes in dicts; ``log`` lists every operation in order."""

    def __init__(
        self,
        brain: BrainScript | None = None,
        *,
        verify: Mapping[str, tuple[int, str]] | None = None,
        fail_at: dict[str, BaseException] | None = None,
    ) -> None:
        self.brain = brain or BrainScript()
        self.verify = dict(verify or {})
        self.fail_at = dict(fail_at or {})
        self.containers: dict[str, MemoryContainer] = {}
        self.networks: dict[str, dict[str, str]] = {}
        self.volumes: dict[str, dict[str, str]] = {}
        self.egress: list[MemoryEgress] = []
        self.agents: list[MemoryContainer] = []  # every agent container ever created
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    # --- scripting helpers ----------------------------------------------------------------

    def _point(self, name: str) -> None:
        exc = self.fail_at.pop(name, None)
        if exc is not None:
            self.log.append(("fail", name))
            raise exc

    def _add(
        self,
        run_id: str,
        role: str,
        environment: dict[str, str],
        network: str | None,
        mounts: list[dict[str, object]],
    ) -> MemoryContainer:
        container = MemoryContainer(
            id=secrets.token_hex(32),
            run_id=run_id,
            role=role,
            # As hardening labels them: the run on every container, the role on verify's.
            labels={LABEL_RUN: run_id, **({LABEL_ROLE: role} if role == "verify" else {})},
            environment=dict(environment),
            network=network,
            mounts=list(mounts),
        )
        with self._lock:
            self.containers[container.id] = container
        return container

    def _get(self, container_id: str, action: str) -> MemoryContainer:
        container = self.containers.get(container_id)
        if container is None:
            raise ContainerError(f"{action} {container_id[:12]}: not found (no such container)")
        return container

    def _exit(self, container: MemoryContainer, code: int) -> None:
        if container.status != "exited":
            container.status = "exited"
            container.exit_code = code
            self.log.append(("exited", container.role))
        if container.stream is not None:
            container.stream.end()

    # --- ApplyRuntime ---------------------------------------------------------------------

    def create(
        self,
        plan: Plan,
        run_id: str,
        *,
        environment: dict[str, str] | None = None,
        network: str | None = None,
        egress_mounts: list[dict[str, object]] | None = None,
        role: str = "agent",
        forward: Sequence[tuple[str, int]] = (),
    ) -> str:
        self._point(f"create:{role}")
        container = self._add(run_id, role, environment or {}, network, egress_mounts or [])
        if role == "agent":
            self.agents.append(container)
        self.log.append(("create", role))
        return container.id

    def start(self, container_id: str) -> None:
        container = self._get(container_id, "starting container")
        self._point(f"start:{container.role}")
        container.status = "running"
        self.log.append(("start", container.role))

    @contextlib.contextmanager
    def attach(self, container_id: str) -> Iterator[DuplexStream]:
        container = self._get(container_id, "attaching to container")
        self._point("attach")
        container.stream = _BrainEnd(self, container)
        self.log.append(("attach", container.role))
        try:
            yield container.stream
        finally:
            container.stream.detached = True

    def state(self, container_id: str) -> ContainerState:
        container = self._get(container_id, "inspecting container")
        return ContainerState(container.status == "running", 0, container.exit_code)

    def wait(self, container_id: str, timeout: float | None = None) -> Mapping[str, object]:
        container = self._get(container_id, "waiting for container")
        return {"exit_code": container.exit_code, "oom_killed": False, "error": ""}

    def stop(self, container_id: str, timeout: int | None = None) -> None:
        container = self._get(container_id, "stopping container")
        self._point("stop")
        self.log.append(("stop", container.role))
        self._exit(container, self.brain.exit_code)

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        container = self._get(container_id, "killing container")
        self.log.append(("kill", container.role))
        self._exit(container, 137)

    def remove(self, container_id: str, *, force: bool = True) -> None:
        found = self.containers.get(container_id)
        self._point(f"remove:{found.role if found else 'gone'}")
        with self._lock:
            container = self.containers.pop(container_id, None)
        if container is not None:
            self._exit(container, container.exit_code if container.exit_code is not None else 137)
            self.log.append(("remove", container.role))

    def exec(
        self, container_id: str, argv: list[str], *, user: str, workdir: str
    ) -> tuple[int, bytes]:
        container = self._get(container_id, "exec in container")
        self._point("exec")
        if container.status != "running":
            raise ContainerError(f"exec in container {container_id[:12]}: is not running")
        command = argv[-1]
        self.log.append(("exec", command))
        code, output = self.verify.get(command, (0, ""))
        return code, output.encode()

    def exec_stream(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        workdir: str,
        into: BinaryIO,
        limit: int,
    ) -> tuple[int, int, bool]:
        """As exec: a command the test set in ``verify`` answers its output, cut at
        ``limit``."""
        code, output = self.exec(container_id, argv, user=user, workdir=workdir)
        into.write(output[:limit])
        return code, min(len(output), limit), len(output) <= limit

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
    ) -> MemoryEgress:
        self._point("start_egress")
        egress = MemoryEgress(self, run_id, on_event, injection, injection_secret)
        self.egress.append(egress)
        self.log.append(("start_egress", run_id))
        return egress

    def start_forwarder(self, container_id: str, config: AgentNetworkConfig) -> None:
        self._get(container_id, "starting the egress forwarder in")
        self._point("start_forwarder")
        self.log.append(("start_forwarder", config.volume))

    def sweep_egress(self, store: StateStore) -> list[str]:
        return []

    def list(self, labels: dict[str, str] | None = None, *, all: bool = True) -> list[str]:
        wanted = labels or {LABEL_RUN: ""}
        found = []
        for container in list(self.containers.values()):
            if all or container.status == "running":
                have = container.labels
                if all_match(have, wanted):
                    found.append(container.id)
        return found


def all_match(have: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(k in have and (not v or have[k] == v) for k, v in wanted.items())


class _BrainEnd:
    """The container side of the brain channel: the entrypoint's protocol, scripted."""

    def __init__(self, runtime: MemoryRuntime, container: MemoryContainer) -> None:
        self.runtime = runtime
        self.container = container
        self.out: deque[bytes] = deque()  # b"" marks the end of the output
        self.buffer = b""
        self.detached = False
        self.closed = False

    def end(self) -> None:
        self.out.append(b"")

    def _say(self, obj: Mapping[str, object]) -> None:
        self.out.append((json.dumps(obj) + "\n").encode())

    async def read(self) -> bytes:
        while not self.out:
            await asyncio.sleep(_POLL_SECONDS)
        chunk = self.out[0]
        if chunk:
            self.out.popleft()
        return chunk

    async def write(self, data: bytes) -> None:
        if self.closed or self.container.status == "exited":
            raise StreamClosed("the container is gone")
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self._handle(json.loads(line))

    def _handle(self, msg: dict[str, object]) -> None:
        container, runtime = self.container, self.runtime
        kind, lease = msg.get("type"), str(msg.get("lease"))
        if kind == "credentials":
            runtime._point("credentials")
            container.credentials[lease] = {"files": msg.get("files"), "env": msg.get("env")}
            container.delivered.append(lease)
            self._say({"type": "credentials-applied", "lease": lease})
        elif kind == "revoke-credentials":
            container.credentials.pop(lease, None)
            container.revoked.append(lease)
            self._say({"type": "credentials-revoked", "lease": lease})
        elif kind == "turn":
            container.turns.append(msg)
            runtime._point("turn")
            script = runtime.brain
            if script.on_turn is not None:
                script.on_turn()
            for decision in script.egress:
                runtime.egress[-1].decide(decision)
            for event in script.events:
                self._say(event_to_json(event))
            if script.crash:
                runtime._exit(container, script.exit_code)
        elif kind == "stop":
            runtime._exit(container, runtime.brain.exit_code)

    async def close(self) -> None:
        self.closed = True
