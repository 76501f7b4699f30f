"""One run's egress: an internal network, an outbound network and a squid proxy between.

    with EgressSession.start(client, plan, run_id, on_event) as egress:
        net = egress.agent_network_config()
        kwargs = hardening.container_kwargs(plan, run_id, network=net.network,
                                            environment=net.environment)
        kwargs["dns"] = net.dns
        ...run the agent container...
    # proxy and both networks are gone here, also after an exception or Ctrl-C

The agent container joins only the internal network (``internal=True``: Docker gives it
no gateway), so its one reachable peer is the proxy: if the proxy dies the agent has no
route out. The proxy alone is also on the outbound network. Anything that goes wrong
before the proxy is ready tears everything down and raises SetupError / RefusedError,
so the run does not start.
"""

from __future__ import annotations

import base64
import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from kagura_agent.clock import Clock, SystemClock, iso
from kagura_agent.errors import SetupError
from kagura_agent.membrane import images
from kagura_agent.membrane.egress import audit, owner
from kagura_agent.membrane.egress.policy import EgressPolicy, load_policy
from kagura_agent.membrane.egress.squid import PROXY_PORT, READY_MARKER, render_squid_conf
from kagura_agent.membrane.egress.sweep import remove_network, sweep_orphans
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

EventSink = Callable[[dict[str, Any]], None]
PROXY_USER = "13:13"  # Debian's `proxy` user
_TMPFS = "rw,nosuid,nodev,noexec,uid=13,gid=13,mode=0700,size="
# squid needs a few writable directories on its read-only root.
PROXY_TMPFS = {
    "/run/squid": _TMPFS + "1048576",
    "/tmp": _TMPFS + "16777216",
    "/var/spool/squid": _TMPFS + "16777216",
    "/var/log/squid": _TMPFS + "1048576",
}
# The internal network carries only agent <-> proxy traffic and never leaves the host, so
# it takes the largest MTU a veth pair allows: a 64 KB write of the proxy's tunnel then
# crosses the bridge as one packet instead of ~45, which cut the CPU the proxied path
# spends in the network stack (bench/egress_throughput.py: ~0.088 s -> ~0.074 s per 100 MB).
# The outbound network keeps the daemon's MTU: its packets leave through the host's uplink.
INTERNAL_MTU = 65535


@dataclass(frozen=True)
class AgentNetworkConfig:
    """What the agent container needs: join ``network`` only, use these env and dns."""

    network: str
    proxy_url: str
    environment: dict[str, str] = field(default_factory=dict)
    # The embedded resolver forwards names it does not know to these servers, from inside
    # the agent's network namespace: loopback answers nothing, so no name resolves.
    dns: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    # Fail a lookup after one short try instead of stalling tools for tens of seconds.
    dns_opt: list[str] = field(default_factory=lambda: ["timeout:1", "attempts:1"])

    def docker_kwargs(self) -> dict[str, Any]:
        """docker-py ``containers.create`` keywords (merge into the hardened kwargs)."""
        return {
            "network_mode": self.network,
            "environment": dict(self.environment),
            "dns": list(self.dns),
            "dns_opt": list(self.dns_opt),
        }


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
        }
        self.internal_network = f"kagura-egress-{_safe(run_id)}-internal"
        self.outbound_network = f"kagura-egress-{_safe(run_id)}-outbound"
        self.proxy_name = f"kagura-egress-{_safe(run_id)}-proxy"
        self.proxy: Any = None
        self.proxy_ip = ""
        self.events: list[audit.EgressEvent] = []
        self._lock = threading.Lock()
        self._collector: threading.Thread | None = None
        self._stream: Any = None
        self._closed = False

    @classmethod
    def start(
        cls,
        client: Any,
        plan: Plan,
        run_id: str,
        on_event: EventSink | None = None,
        *,
        store: StateStore | None = None,
        image: str | None = None,
        clock: Clock | None = None,
        ready_timeout: float = 20.0,
        extra_hosts: dict[str, str] | None = None,
    ) -> EgressSession:
        """Sweep orphans, create the networks and the proxy, and wait until it listens.

        Raises RefusedError when the allowlist cannot be enforced and SetupError when the
        proxy cannot start; in both cases nothing of this run is left behind.
        ``extra_hosts`` (name -> address, written to the proxy's /etc/hosts) lets tests make
        names resolve to addresses no test may really reach.
        """
        policy = load_policy(plan.get("egress"))
        if policy.mode != "proxy":
            raise SetupError("egress mode is 'none': the agent gets network_mode none, no proxy")
        store = audit.open_store(store or StateStore())
        with docker_errors("sweeping egress orphans"):
            sweep_orphans(client, store)
        session = cls(client, policy, run_id, store, on_event or (lambda _event: None))
        audit.record_run(store, run_id, iso((clock or SystemClock()).now()), plan["egress"])
        try:
            session._create(
                image or images.image_ref("egress-proxy"), ready_timeout, extra_hosts or {}
            )
        except BaseException:
            session.close(clock=clock)
            raise
        return session

    def _labels_for(self, component: str) -> dict[str, str]:
        return {**self._labels, owner.LABEL_COMPONENT: component}

    def _create(self, image: str, ready_timeout: float, extra_hosts: dict[str, str]) -> None:
        import docker.errors
        import docker.types

        with docker_errors(f"creating the egress networks of run {self.run_id}"):
            internal = self.client.networks.create(
                self.internal_network,
                driver="bridge",
                internal=True,
                options={"com.docker.network.driver.mtu": str(INTERNAL_MTU)},
                labels=self._labels_for(owner.COMPONENT_INTERNAL),
            )
            self.client.networks.create(
                self.outbound_network,
                driver="bridge",
                labels=self._labels_for(owner.COMPONENT_OUTBOUND),
            )
        subnets = [c["Subnet"] for c in (internal.attrs.get("IPAM") or {}).get("Config") or []]
        conf = render_squid_conf(self.policy, subnets)
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            raise SetupError(
                f"the egress proxy image {image} is not built",
                hint="run: kagura-agent images build egress-proxy",
            ) from exc
        with docker_errors(f"starting the egress proxy of run {self.run_id}"):
            self.proxy = self.client.containers.create(
                image,
                name=self.proxy_name,
                labels=self._labels_for(owner.COMPONENT_PROXY),
                environment={"KAGURA_SQUID_CONF_B64": base64.b64encode(conf.encode()).decode()},
                user=PROXY_USER,
                network=self.outbound_network,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                tmpfs=PROXY_TMPFS,
                pids_limit=64,
                mem_limit=512 * 1024 * 1024,
                extra_hosts=extra_hosts,
                # json-file without rotation: the audit re-reads the whole log at teardown.
                log_config=docker.types.LogConfig(type="json-file"),
            )
            internal.connect(self.proxy)
            self.proxy.start()
        self._wait_ready(ready_timeout)
        self.proxy.reload()
        networks = self.proxy.attrs["NetworkSettings"]["Networks"]
        self.proxy_ip = networks[self.internal_network]["IPAddress"]
        self._collector = threading.Thread(
            target=self._collect, name=f"egress-audit-{self.run_id}", daemon=True
        )
        self._collector.start()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with docker_errors("waiting for the egress proxy"):
                logs = self.proxy.logs(stdout=False, stderr=True).decode(errors="replace")
                if READY_MARKER in logs:
                    return
                state = self.client.api.inspect_container(self.proxy.id)["State"]
            if not state.get("Running"):
                tail = "\n".join(logs.splitlines()[-15:])
                raise SetupError(
                    f"the egress proxy of run {self.run_id} exited"
                    f" (status {state.get('ExitCode')}):\n{tail}"
                )
            if time.monotonic() > deadline:
                raise SetupError(f"the egress proxy of run {self.run_id} not ready in {timeout}s")
            time.sleep(0.02)

    def agent_network_config(self) -> AgentNetworkConfig:
        """Network, proxy environment and DNS for the agent container of this run."""
        url = f"http://{self.proxy_ip}:{PROXY_PORT}"
        local = "localhost,127.0.0.1,::1"
        env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url}
        env |= {"NO_PROXY": local, "no_proxy": local}
        return AgentNetworkConfig(network=self.internal_network, proxy_url=url, environment=env)

    # --- audit -------------------------------------------------------------------------

    def _accept(self, events: list[audit.EgressEvent], store: StateStore) -> None:
        with self._lock:
            fresh = audit.record_events(store, events)
            self.events.extend(fresh)
        for event in fresh:
            self._emit({"type": "egress.decision", **event.to_json()})

    def _emit(self, event: dict[str, Any]) -> None:
        # A broken consumer must not stop the audit trail.
        with contextlib.suppress(Exception):
            self._sink(event)

    def _collect(self) -> None:
        """Follow the proxy's stdout, storing each decision as it happens."""
        seq, pending = 0, b""
        with StateStore(self.store.path) as store:
            try:
                self._stream = self.proxy.logs(stdout=True, stderr=False, stream=True, follow=True)
                for chunk in self._stream:
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        raw = audit.parse_line(line.decode(errors="replace"))
                        if raw is not None:
                            event = audit.classify(raw, self.policy, self.run_id, seq)
                            self._accept([event], store)
                            seq += 1
            except Exception:  # the stream ends when the proxy goes; teardown re-reads the log
                pass

    def denial_summary(self) -> list[dict[str, Any]]:
        """What the agent tried to reach and was refused, grouped, most frequent first."""
        with self._lock:
            return audit.denial_summary(self.events)

    # --- teardown ------------------------------------------------------------------------

    def close(self, *, clock: Clock | None = None) -> None:
        """Remove the proxy and both networks; store the last decisions; emit the summary."""
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []
        if self.proxy is not None:
            try:
                self._final_audit()
            except Exception as exc:
                problems.append(f"reading the proxy log: {exc}")
            try:
                self.proxy.remove(force=True)
            except Exception as exc:
                problems.append(f"removing {self.proxy_name}: {exc}")
        for name in (self.internal_network, self.outbound_network):
            try:
                remove_network(self.client, name)
            except Exception as exc:
                problems.append(f"removing network {name}: {exc}")
        audit.finish_run(self.store, self.run_id, iso((clock or SystemClock()).now()))
        with self._lock:
            allowed = sum(1 for e in self.events if e.decision == "allow")
            denied = len(self.events) - allowed
        summary = {"type": "egress.summary", "run_id": self.run_id, "allowed": allowed}
        self._emit({**summary, "denied": denied, "denials": self.denial_summary()})
        if problems:
            # Leftovers carry our owner label: the next start's sweep removes them.
            raise SetupError("egress teardown incomplete: " + "; ".join(problems))

    def _final_audit(self) -> None:
        # Already dead (killed, crashed) is fine: its log is still readable.
        with contextlib.suppress(Exception):
            self.proxy.kill()
        if self._collector is not None:
            self._collector.join(timeout=5)
            if self._stream is not None and self._collector.is_alive():
                self._stream.close()
        text = self.proxy.logs(stdout=True, stderr=False).decode(errors="replace")
        self._accept(audit.events_from_log(text, self.policy, self.run_id), self.store)

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
