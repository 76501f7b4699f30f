"""One run's egress: a squid proxy on an outbound network, reached over a Unix socket.

    with EgressSession.start(client, EgressRequest(plan, run_id), on_event) as egress:
        net = egress.agent_network_config()
        ...create the agent container with net.docker_kwargs() (network_mode none,
        the proxy environment, the socket volume read-only)...
    # proxy, network and socket volume are gone here, also after an exception or Ctrl-C

The agent container has no network at all (``network_mode: none``: loopback only), so
there is no IP path from it to the host, the Docker bridges or anything else. Its one
way out is a Unix socket on a small tmpfs volume that it and the proxy container mount:
inside the agent a forwarder (forwarder.py: apply starts it with the container's own
command, before the image's entrypoint; :func:`start_forwarder` starts it with ``docker
exec`` in a running container; either way it needs only ``python3`` in the image)
listens on 127.0.0.1:3128 and copies connections to the socket; inside the proxy
container socat listens on the socket and hands each connection to squid, which listens
on the proxy's loopback only. The proxy alone is on the outbound network. If the proxy
dies the agent has no way out. Anything that goes wrong before the proxy is ready tears
everything down and raises SetupError / RefusedError, so the run does not start.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kagura_agent.clock import Clock, SystemClock, iso
from kagura_agent.errors import SetupError
from kagura_agent.membrane import images
from kagura_agent.membrane.egress import audit, forwarder, owner, pool
from kagura_agent.membrane.egress.hostaddrs import docker_host_addresses
from kagura_agent.membrane.egress.modelport import (
    INJECT_PORT,
    CallLimits,
    Injection,
    ModelCallPolicy,
    check_secret,
    render_nginx_conf,
    set_key,
    set_limits,
    set_policy,
)
from kagura_agent.membrane.egress.policy import EgressPolicy, load_policy
from kagura_agent.membrane.egress.proxy import (
    AGENT_SOCKET_DIR,
    INJECT_SOCKET_NAME,
    PROXY_SOCKET_DIR,
    PROXY_TMPFS,
    PROXY_USER,
    SOCKET_NAME,
    VOLUME_OPTS,
    proxy_create_kwargs,
    wait_for_ready,
)
from kagura_agent.membrane.egress.reload import reload_allowlist, start_reload
from kagura_agent.membrane.egress.request import EgressRequest
from kagura_agent.membrane.egress.squid import PROXY_PORT, render_squid_conf
from kagura_agent.membrane.egress.sweep import (
    remove_network,
    remove_volume_if_unused,
    sweep_orphans,
)
from kagura_agent.membrane.hardening import LABEL_RUN, LABEL_STORE, START_DIR
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.state import StateStore, open_store, owner_key

# How long the proxy has to end its connections (and log them) when the run is over.
STOP_SECONDS = 5

EventSink = Callable[[dict[str, Any]], None]
# Re-exported: tests and bench/ build proxies the way sessions do.
__all__ = [
    "PROXY_TMPFS",
    "PROXY_USER",
    "AgentNetworkConfig",
    "EgressRequest",
    "EgressSession",
    "start_forwarder",
]


@dataclass(frozen=True)
class AgentNetworkConfig:
    """What the agent container needs: no network, the proxy environment, the socket volume."""

    volume: str
    proxy_url: str
    socket_path: str
    port: int
    environment: dict[str, str] = field(default_factory=dict)
    # (socket, port) of the credential-injecting reverse proxy, when the run has one.
    inject: tuple[str, int] | None = None
    # A warm session's proxy may still be loading the run's configuration: the forwarder
    # (the agent's one way out) starts only once this returns (raises when it never does).
    wait_ready: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    @property
    def network(self) -> str:
        return "none"

    def forwards(self) -> list[tuple[str, int]]:
        """The forwarder's (socket path, port) pairs: the proxy's, and the injector's."""
        return [(self.socket_path, self.port), *([self.inject] if self.inject else [])]

    def mounts(self) -> list[dict[str, Any]]:
        """The socket volume, read-only, as a docker-py ``Mount`` mapping."""
        return [
            {
                "Type": "volume",
                "Source": self.volume,
                "Target": AGENT_SOCKET_DIR,
                "ReadOnly": True,
                "VolumeOptions": {"NoCopy": True},
            }
        ]

    def docker_kwargs(self) -> dict[str, Any]:
        """docker-py ``containers.create`` keywords (merge into the hardened kwargs)."""
        return {
            "network_mode": "none",
            "environment": dict(self.environment),
            "mounts": self.mounts(),
        }


def start_forwarder(
    client: Any, container_id: str, net: AgentNetworkConfig, timeout: float = 60.0
) -> None:
    """Start the forwarder in the (running) agent container and wait until it listens.

    It runs as the container's user, like the agent's tools: it holds nothing secret, and
    an agent that kills it only cuts its own way out. Readiness is the forwarder's own
    line on stderr, printed once it is bound, read from the exec's attached stream: one
    exec per socket and no polling, so many runs starting at once cost the daemon one
    round trip each (polling /proc/net/tcp with an exec every 20 ms did not finish in
    10 s with 20 runs starting on two cores). A forwarder that dies is seen at once (the
    stream ends), so the deadline is generous: it only bounds a machine that is swamped.
    """
    if net.wait_ready is not None:
        net.wait_ready()
    pairs = net.forwards()
    deadline = time.monotonic() + timeout
    for path, port in pairs:
        with docker_errors(f"starting the egress forwarder in {container_id[:12]}"):
            started = client.api.exec_create(
                container_id,
                forwarder.command(path, port),
                stdout=False,
                stderr=True,
                workdir=START_DIR,
            )
            stream = client.api.exec_start(started["Id"], socket=True)
        raw = getattr(stream, "_sock", stream)
        seen = b""
        marker = forwarder.ready_line(path, port).encode()
        try:
            while marker not in seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SetupError(
                        f"the egress forwarder in {container_id[:12]} not ready in {timeout}s"
                    )
                raw.settimeout(remaining)
                try:
                    chunk = raw.recv(4096)
                except TimeoutError:
                    continue
                except OSError as exc:
                    raise SetupError(
                        f"waiting for the egress forwarder in {container_id[:12]}: {exc}"
                    ) from exc
                if not chunk:
                    tail = seen.decode(errors="replace")[-400:]
                    raise SetupError(
                        f"the egress forwarder in {container_id[:12]} exited at start: {tail}"
                    )
                seen = (seen + chunk)[-8192:]
        finally:
            # The forwarder keeps running: it writes nothing more after its ready line.
            with contextlib.suppress(OSError):
                raw.close()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _safe(run_id: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", run_id)[:48]


class EgressSession:
    """A started proxy for one run. Build with :meth:`start`; always :meth:`close`."""

    def __init__(
        self, client: Any, policy: EgressPolicy, run_id: str, store: StateStore, sink: EventSink
    ) -> None:
        self.client = client
        self.policy = policy
        self.run_id = run_id
        self.store = store
        self._sink = sink
        self._labels = {
            LABEL_RUN: run_id,
            owner.LABEL_OWNER: owner.current_owner(),
            LABEL_STORE: owner_key(store.location),
        }
        self.socket_volume = f"kagura-egress-{_safe(run_id)}-socket"
        self.outbound_network = f"kagura-egress-{_safe(run_id)}-outbound"
        self.proxy_name = f"kagura-egress-{_safe(run_id)}-proxy"
        self.proxy: Any = None
        self.events: list[audit.EgressEvent] = []
        self._lock = threading.Lock()
        self._collector: threading.Thread | None = None
        self._stream: Any = None
        self._closed = False
        self._complete = False  # the collector read the proxy's log to its end
        self._volume_pending = False
        self.injection: Injection | None = None
        self.model_policy = ModelCallPolicy()
        self.model_policy_generation = 0
        self.call_limits: CallLimits | None = None
        self._secret = ""
        self._extra_networks: tuple[str, ...] = ()
        self.warm = False  # a pooled session (pool.py), claimed for this run
        self.pooled_name = ""
        self._claimed_path: Path | None = None
        self._wait_pooled: Callable[[], None] | None = None
        self.scrub: Callable[[str], str] | None = None  # the run's redactor (see start)
        # What the agent may make the host keep (audit.py): past log_ceiling bytes of the
        # proxy's log the run is stopped (an egress.flood event), past event_ceiling
        # decisions they are counted instead of stored.
        self.log_ceiling = audit.LOG_CEILING
        self.event_ceiling = audit.EVENT_CEILING
        self.flooded: str | None = None  # why the collector stopped at the ceiling

    @classmethod
    def start(
        cls,
        client: Any,
        request: EgressRequest,
        on_event: EventSink | None = None,
        *,
        store: StateStore | None = None,
        clock: Clock | None = None,
    ) -> EgressSession:
        """Sweep orphans, create the networks and the proxy, and wait until it listens.

        Raises RefusedError when the allowlist cannot be enforced and SetupError when the
        proxy cannot start; in both cases nothing of this run is left behind.
        With ``request.from_pool``, an idle pooled session (pool.py) is claimed when there
        is one: it gets this run's configuration and is this run's alone (``warm`` is then
        True); otherwise, or when the claimed one does not take the configuration, a cold
        start. A run with a credential injection or test reach always starts cold.
        ``request.scrub`` (the run's redactor) is applied to every decision before it is
        stored or emitted; ``log_ceiling`` and ``event_ceiling`` bound what the run makes
        the host keep (audit.py; tests make them small). See request.py for the rest.
        """
        plan, run_id = request.plan, request.run_id
        policy = load_policy(plan.get("egress")).on_host(docker_host_addresses())
        if policy.mode != "proxy":
            raise SetupError("egress mode is 'none': the agent gets network_mode none, no proxy")
        store = audit.open_store(store or open_store())
        if request.sweep:  # False: the caller has just swept (apply does, before its run row)
            with docker_errors("sweeping egress orphans"):
                sweep_orphans(client, store)
        session = cls(client, policy, run_id, store, on_event or (lambda _event: None))
        session.scrub = request.scrub
        session.log_ceiling, session.event_ceiling = request.log_ceiling, request.event_ceiling
        if request.injection is not None:
            if not request.injection_secret:
                raise SetupError("a credential injection needs its secret")
            check_secret(request.injection_secret)
            session.injection = request.injection
            session._secret = request.injection_secret
            # The plan's model-call policy, and caps from its turn budget: in force from
            # the first call (modelport.py).
            section = plan["egress"].get("model_calls")
            session.model_policy = ModelCallPolicy.from_plan(section)
            session.call_limits = CallLimits.for_budget(
                plan["budget"]["turns"], session.model_policy.concurrency
            )
        audit.record_run(store, run_id, iso((clock or SystemClock()).now()), plan["egress"])
        # The plan's pinned proxy image (egress.proxy) by ID, so a retag never changes it.
        pin = plan["egress"].get("proxy")
        pinned = pin["digest"] if pin else None
        proxy_image = request.image or pinned or images.image_ref("egress-proxy")
        pool_tag = request.image or images.image_ref("egress-proxy")
        if request.from_pool and not request.cold_only and session._adopt_pooled(pool_tag, pinned):
            audit.mark_session(store, run_id, f"warm:{session.pooled_name}")
            return session
        audit.mark_session(store, run_id, "cold")
        try:
            session._extra_networks = request.extra_networks
            session._create(proxy_image, request.ready_timeout, dict(request.extra_hosts))
        except BaseException:
            session.close(clock=clock)
            raise
        return session

    def _adopt_pooled(self, tag: str, pinned: str | None) -> bool:
        """Claim an idle pooled session and load this run's allowlist into it; False: none.

        The keeper's sessions run its proxy tag; one whose image is not the plan's
        ``pinned`` ID (the tag was rebuilt or retagged since the plan) is removed unused.
        """
        claimed = pool.claim(self.run_id, tag)
        if claimed is None:
            return False
        pooled, path = claimed
        try:
            if pinned and self.client.api.inspect_container(pooled.proxy_id)["Image"] != pinned:
                raise SetupError(f"pooled session {pooled.name} runs another proxy image")
            conf = render_squid_conf(self.policy, ["127.0.0.1/32"])
            self._wait_pooled = start_reload(
                self.client, pooled.proxy_id, conf, user=PROXY_USER, timeout=10.0
            )
        except Exception:
            # Dead or unwilling: it is nobody's now; remove it here and start cold.
            with contextlib.suppress(Exception):
                if pool.remove_objects(self.client, pooled, pooled.name):
                    pool.forget(path)
            return False
        self.socket_volume = pooled.volume
        self.outbound_network = pooled.network
        self.proxy_name = pooled.proxy_name
        self.proxy = self.client.containers.prepare_model({"Id": pooled.proxy_id})
        self.warm, self.pooled_name, self._claimed_path = True, pooled.name, path
        self._start_collector()
        return True

    def _labels_for(self, component: str) -> dict[str, str]:
        return {**self._labels, owner.LABEL_COMPONENT: component}

    def _create(self, image: str, ready_timeout: float, extra_hosts: dict[str, str]) -> None:
        import docker.errors
        import docker.types

        with docker_errors(f"creating the egress network and socket of run {self.run_id}"):
            self.client.volumes.create(
                self.socket_volume,
                driver="local",
                driver_opts=VOLUME_OPTS,
                labels=self._labels_for(owner.COMPONENT_SOCKET),
            )
            self.client.networks.create(
                self.outbound_network,
                driver="bridge",
                labels=self._labels_for(owner.COMPONENT_OUTBOUND),
            )
        # The outbound network's gateway is a new address of the host (a daemon whose
        # address pool is public puts it in no forbidden range): read them again.
        self.policy = self.policy.on_host(docker_host_addresses())
        # socat connects from the proxy's own loopback: that is the only client squid takes.
        conf = render_squid_conf(self.policy, ["127.0.0.1/32"])
        environment = {
            "KAGURA_SQUID_CONF_B64": _b64(conf),
            "KAGURA_EGRESS_SOCKET": f"{PROXY_SOCKET_DIR}/{SOCKET_NAME}",
        }
        if self.injection is not None and self.call_limits is not None:
            # nginx's configuration, the policy and the limits: no secret in any of them.
            environment |= {
                "KAGURA_EGRESS_INJECT_SOCKET": f"{PROXY_SOCKET_DIR}/{INJECT_SOCKET_NAME}",
                "KAGURA_INJECT_CONF_B64": _b64(render_nginx_conf(self.injection)),
                "KAGURA_INJECT_HOST": self.injection.host,
                "KAGURA_INJECT_POLICY_B64": _b64(self.model_policy.lua_config(self.injection)),
                "KAGURA_INJECT_LIMITS_B64": _b64(self.call_limits.to_json()),
            }
            if self.injection.ca_pem:
                # Certificates only (read_authorities refused any key): nothing secret.
                environment["KAGURA_INJECT_CA_B64"] = _b64(self.injection.ca_pem)
        socket_mount = docker.types.Mount(
            PROXY_SOCKET_DIR, self.socket_volume, type="volume", no_copy=True
        )
        self.proxy = self._create_proxy(image, environment, socket_mount, extra_hosts)
        with docker_errors(f"starting the egress proxy of run {self.run_id}"):
            for name in self._extra_networks:
                self.client.networks.get(name).connect(self.proxy)
            if self.injection is not None:
                self._start_with_secret()
            else:
                self.proxy.start()
        self._wait_ready(ready_timeout)
        self._start_collector()

    def _start_collector(self) -> None:
        self._collector = threading.Thread(
            target=self._collect, name=f"egress-audit-{self.run_id}", daemon=True
        )
        self._collector.start()

    def _create_proxy(
        self,
        image: str,
        environment: dict[str, str],
        socket_mount: Any,
        extra_hosts: dict[str, str],
    ) -> Any:
        import docker.errors

        with docker_errors(f"starting the egress proxy of run {self.run_id}"):
            # No separate image inspect first: create says "no such image" itself (one
            # daemon round trip fewer per run).
            try:
                return self.client.containers.create(
                    image,
                    **proxy_create_kwargs(
                        name=self.proxy_name,
                        labels=self._labels_for(owner.COMPONENT_PROXY),
                        environment=environment,
                        # The injected credential goes in on stdin, never into the config.
                        stdin_open=self.injection is not None,
                        network=self.outbound_network,
                        mounts=[socket_mount],
                        extra_hosts=extra_hosts,
                    ),
                )
            except docker.errors.ImageNotFound as exc:
                raise SetupError(
                    f"the egress proxy image {image} is not built",
                    hint="run: kagura-agent images build egress-proxy",
                ) from exc

    def _start_with_secret(self) -> None:
        params = {"stdin": 1, "stream": 1}
        wrapper = self.client.api.attach_socket(self.proxy.id, params=params)
        sock = getattr(wrapper, "_sock", wrapper)
        try:
            self.proxy.start()
            sock.sendall(self._secret.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
        finally:
            sock.close()
            self._secret = ""

    def _wait_ready(self, timeout: float) -> None:
        wait_for_ready(self.client, self.proxy.id, f"run {self.run_id}", timeout)

    def agent_network_config(self) -> AgentNetworkConfig:
        """No network, the proxy environment and the socket volume for the agent container."""
        url = f"http://127.0.0.1:{PROXY_PORT}"
        path = f"{AGENT_SOCKET_DIR}/{SOCKET_NAME}"
        local = "localhost,127.0.0.1,::1"
        env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url}
        env |= {"NO_PROXY": local, "no_proxy": local}
        env |= {forwarder.SOCKET_ENV: path, forwarder.PORT_ENV: str(PROXY_PORT)}
        inject = None
        if self.injection is not None:
            inject = (f"{AGENT_SOCKET_DIR}/{INJECT_SOCKET_NAME}", INJECT_PORT)
            # The Claude CLI / SDK send their API calls here; the proxy adds the key.
            env["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{INJECT_PORT}"
        return AgentNetworkConfig(
            volume=self.socket_volume,
            proxy_url=url,
            socket_path=path,
            port=PROXY_PORT,
            environment=env,
            inject=inject,
            wait_ready=self._wait_pooled,
        )

    def reload(self, egress: dict[str, Any]) -> None:
        """A mid-run grant: ``egress`` (the amended plan's section) in force, the proxy and
        its open connections kept (reload.py)."""
        policy = reload_allowlist(
            self.client, self.proxy, egress, user=PROXY_USER, host=self.policy.host
        )
        with self._lock:
            self.policy = policy
        model_policy = ModelCallPolicy.from_plan(egress.get("model_calls"))
        if (
            self.injection is not None
            and self.call_limits is not None
            and model_policy != self.model_policy
        ):
            # What the model provider may reach for the agent changed (a granted server
            # tool, MCP host, beta): the injecting port takes it before the grant is said
            # to be in force; until then it keeps refusing what the old policy refused.
            generation = self.model_policy_generation + 1
            set_policy(
                self.client,
                self.proxy.id,
                model_policy,
                self.injection,
                generation,
                user=PROXY_USER,
            )
            self.model_policy, self.model_policy_generation = model_policy, generation
            if model_policy.concurrency != self.call_limits.concurrency:
                limits = dataclasses.replace(self.call_limits, concurrency=model_policy.concurrency)
                set_limits(self.client, self.proxy.id, limits, user=PROXY_USER)
                self.call_limits = limits

    def renew_credential(self, secret: str) -> None:
        """A leased credential of the injection renewed mid-run: the next call carries it."""
        if self.injection is None or self.proxy is None:
            return
        set_key(self.client, self.proxy.id, secret, user=PROXY_USER)

    def limit_model_calls(self, turns: int | None) -> None:
        """A turn budget extended mid-run: the injecting port's caps follow it (the calls
        counted so far stay counted). Nothing to do for a run without an injection."""
        if self.call_limits is None or self.proxy is None:
            return
        limits = CallLimits.for_budget(turns, self.model_policy.concurrency)
        set_limits(self.client, self.proxy.id, limits, user=PROXY_USER)
        self.call_limits = limits

    # --- audit -------------------------------------------------------------------------

    def _accept(self, events: list[audit.EgressEvent], store: StateStore) -> None:
        if self.scrub is not None:
            events = [audit.scrubbed(event, self.scrub) for event in events]
        with self._lock:
            fresh = audit.record_events(store, events, self.event_ceiling)
            # Only what is stored is kept here: the rest is counted in the run's row.
            self.events.extend(e for e in fresh if e.seq < self.event_ceiling)
        for event in fresh:
            self._emit({"type": "egress.decision", **event.to_json()})

    def _emit(self, event: dict[str, Any]) -> None:
        # A broken consumer must not stop the audit trail.
        with contextlib.suppress(Exception):
            self._sink(event)

    def _collect(self) -> None:
        """Follow the proxy's stdout, storing each decision as it happens.

        Every byte counts, lines that are no decision too (an empty connection logs one):
        past ``log_ceiling`` the collector stops reading and emits ``egress.flood``, which
        stops the run (tripwire.py)."""
        seq, pending, read = 0, b"", 0
        with StateStore(self.store.location) as store:
            try:
                self._stream = self.proxy.logs(stdout=True, stderr=False, stream=True, follow=True)
                for chunk in self._stream:
                    read += len(chunk)
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        raw = audit.parse_line(line.decode(errors="replace"))
                        if raw is not None:
                            event = audit.classify(raw, self.policy, self.run_id, seq)
                            self._accept([event], store)
                            seq += 1
                    if read > self.log_ceiling:
                        self._flood(read)
                        return
                    pending = pending[: self.log_ceiling]
                # The followed log ended by itself (the proxy stopped) on a whole line:
                # every decision has been read, teardown need not read the log again.
                self._complete = not pending
            except Exception:  # the stream ends when the proxy goes; teardown re-reads the log
                pass

    def _flood(self, read: int) -> None:
        # Every decision up to the ceiling was taken in live: reading the log again at
        # teardown or in drain() would only read the same lines (minutes of a host CPU
        # for a 32 MiB log).
        self._complete = True
        self.flooded = (
            f"the agent made the egress proxy log {read} bytes, past the run's ceiling of"
            f" {self.log_ceiling} (a flood of requests or connections)"
        )
        with contextlib.suppress(Exception):
            self._stream.close()
        self._emit({"type": "egress.flood", "run_id": self.run_id, "reason": self.flooded})

    def _read_log(self, policy: EgressPolicy, store: StateStore) -> None:
        """Store the decisions of the proxy's log, read once from its start and at most
        ``log_ceiling`` bytes far, a batch at a time (not again after a flood stop)."""
        if self.flooded:
            return
        stream = self.proxy.logs(stdout=True, stderr=False, stream=True, follow=False)
        try:
            lines = audit.log_lines(stream, self.log_ceiling)
            for batch in audit.batched(audit.events_from_lines(lines, policy, self.run_id)):
                self._accept(batch, store)
        finally:
            with contextlib.suppress(Exception):
                stream.close()

    def drain(self) -> None:
        """Take in every decision the proxy has logged so far (the live collector may lag
        behind): read its whole log once; a decision already seen is not emitted again."""
        if self.proxy is None:
            return
        with self._lock:
            policy = self.policy
        with docker_errors(f"reading the egress proxy log of run {self.run_id}"):
            self._read_log(policy, self.store)

    def denial_summary(self) -> list[dict[str, Any]]:
        """What the agent tried to reach and was refused, grouped, most frequent first."""
        with self._lock:
            return audit.denial_summary(self.events)

    # --- teardown ------------------------------------------------------------------------

    def close(self, *, clock: Clock | None = None) -> None:
        """Remove the proxy, its network and socket; store the last decisions; emit the summary."""
        if self._closed:
            # The agent container was still mounting the socket volume last time: retry.
            if self._volume_pending:
                self._volume_pending = not remove_volume_if_unused(self.client, self.socket_volume)
            return
        self._closed = True
        problems: list[str] = []
        if self._claimed_path is not None and pool.retire(self._claimed_path):
            # A warm session goes back to its keeper, which kills the proxy, stores the
            # rest of its decisions (by sequence number: none twice) and removes it, in
            # the background; any sweep does all that, should the keeper go first. The
            # agent is gone by now (its container is removed before this), so nothing
            # can pass the proxy any more.
            with contextlib.suppress(Exception):
                if self._stream is not None:
                    self._stream.close()
            self._finish(problems, clock)
            return
        if self.proxy is not None:
            try:
                self._final_audit()
            except Exception as exc:
                problems.append(f"reading the proxy log: {exc}")
        if self.proxy is not None:
            try:
                self.proxy.remove(force=True)
            except Exception as exc:
                problems.append(f"removing {self.proxy_name}: {exc}")
        try:
            remove_network(self.client, self.outbound_network)
        except Exception as exc:
            problems.append(f"removing network {self.outbound_network}: {exc}")
        try:
            # Still mounted by a live agent container (the caller closes before removing
            # it): the socket is dead once the proxy is gone; the next close() or sweep
            # removes the volume.
            self._volume_pending = not remove_volume_if_unused(self.client, self.socket_volume)
        except Exception as exc:
            problems.append(f"removing volume {self.socket_volume}: {exc}")
        if self._claimed_path is not None and not problems and not self._volume_pending:
            pool.forget(self._claimed_path)
        self._finish(problems, clock)

    def _finish(self, problems: list[str], clock: Clock | None) -> None:
        audit.finish_run(self.store, self.run_id, iso((clock or SystemClock()).now()))
        unstored = audit.unstored(self.store, self.run_id)
        with self._lock:
            allowed = sum(1 for e in self.events if e.decision == "allow")
            denied = len(self.events) - allowed
        allowed, denied = allowed + unstored["allow"], denied + unstored["deny"]
        summary = {"type": "egress.summary", "run_id": self.run_id, "allowed": allowed}
        summary |= {"denied": denied, "unstored": sum(unstored.values())}
        self._emit({**summary, "denials": self.denial_summary()})
        if problems:
            # Leftovers carry our owner label: the next start's sweep removes them.
            raise SetupError("egress teardown incomplete: " + "; ".join(problems))

    def _final_audit(self) -> None:
        # SIGTERM first: squid (shutdown_lifetime 0) ends every connection still open and
        # logs it, so a tunnel the agent still holds is in the run's log; a proxy that has
        # not exited by then is killed. Already dead (killed, crashed) is fine: its log is
        # still readable.
        with contextlib.suppress(Exception):
            self.proxy.stop(timeout=STOP_SECONDS)
        with contextlib.suppress(Exception):
            self.proxy.kill()
        if self._collector is not None:
            self._collector.join(timeout=5)
            if self._stream is not None and self._collector.is_alive():
                self._stream.close()
        if self._complete and self._collector is not None and not self._collector.is_alive():
            return
        self._read_log(self.policy, self.store)

    def __enter__(self) -> EgressSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except SetupError:
            if exc is None:
                raise
