"""A warm pool of egress sessions: proxies started ahead, each handed to exactly one run.

A cold run creates its socket volume and outbound network and starts squid (about half a
second, most of it the daemon wiring the network). A pooled session is all of that done
ahead by a keeper process (``kagura-agent egress pool serve``), with squid running a
deny-everything configuration. A run that finds an idle session claims it, writes its own
allowlist into it and has squid reload (reload.py), and never gives it
back: after the run the session is destroyed, and the keeper starts a fresh one.

Used once, never reused: no reset has to be proven, because nothing of a run is ever seen
by another one. Each run's squid, socket volume (the agent's one way out) and network
were made for it alone; what the run leaves in them goes with them.

Claiming is a rename(2) in the state directory — ``idle/NAME.json`` to
``claimed/NAME@OWNER.json`` — so exactly one process wins a session, and the winner's
identity (host, pid, process start time: owner.py) is in the name from the very first
instant. The files say who may remove what:

- ``idle/NAME.json``: the keeper's. Removed by any sweep once the keeper is gone.
- ``claimed/NAME@OWNER.json``: the claiming apply's. Removed by any sweep (or the keeper)
  once that process is gone — also when the keeper is gone too, and never while the
  apply lives (the keeper's death does not take a running apply's proxy away).
- ``retired/NAME.json``: the run is over (its agent stopped, its proxy killed and its log
  read): the keeper removes it in the background; any sweep does once the keeper is gone.

The run's configuration goes in the way a live run's mid-run grant does (reload.py: write
and ``squid -k parse`` in one exec, SIGHUP, ready counted from the lines before), in a
thread while the run creates and starts its agent container: a pooled proxy that is gone
fails the claim at once (the run starts cold); one that refuses the file or does not come
back fails the run before its agent has a way out.

The pool is per Docker host and per state directory (its files are in the state
directory; its objects are on this host's daemon).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kagura_agent.membrane import images
from kagura_agent.membrane.egress import owner
from kagura_agent.membrane.egress.policy import EgressPolicy
from kagura_agent.membrane.egress.poolfiles import (
    CLAIMED,
    IDLE,
    LABEL_POOL,
    LABEL_POOL_DIR,
    RETIRED,
    Entry,
    PooledSession,
    claim,
    claimed_runs,
    entries,
    forget,
    forget_dead,
    names_alive,
    pool_dir,
    retire,
    write,
)
from kagura_agent.membrane.egress.proxy import (
    PROXY_SOCKET_DIR,
    SOCKET_NAME,
    VOLUME_OPTS,
    proxy_create_kwargs,
    wait_for_ready,
)
from kagura_agent.membrane.egress.squid import render_squid_conf
from kagura_agent.membrane.egress.sweep import remove_network, remove_volume_if_unused, salvage
from kagura_agent.membrane.hardening import LABEL_STORE
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.state import StateStore, owner_key, state_location

__all__ = [
    "CLAIMED",
    "IDLE",
    "LABEL_POOL",
    "LABEL_POOL_DIR",
    "RETIRED",
    "Entry",
    "Keeper",
    "PoolSettings",
    "PooledSession",
    "claim",
    "claimed_runs",
    "entries",
    "forget",
    "forget_dead",
    "keeper_thread",
    "names_alive",
    "pool_dir",
    "retire",
]


def finish_audit(client: Any, session: PooledSession, store: StateStore) -> None:
    """Kill a used session's proxy and store the decisions its run had not stored yet."""
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        client.api.kill(session.proxy_id)
    with contextlib.suppress(docker.errors.NotFound):
        client.api.wait(session.proxy_id, timeout=10)
    salvage(client, session.proxy_id, session.run_id, store)


# --- the keeper -----------------------------------------------------------------------------


def deny_all_conf() -> str:
    """What an idle pooled squid runs: every request refused (there is no client anyway)."""
    return render_squid_conf(EgressPolicy(mode="proxy"), ["127.0.0.1/32"])


def remove_objects(client: Any, session: PooledSession | None, name: str) -> bool:
    """Remove a pooled session's proxy, network and volume (gone is fine); False when the
    volume is still mounted (by the agent container of a run not yet swept)."""
    import docker.errors

    proxy = session.proxy_id if session else f"{name}-proxy"
    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(proxy, force=True)
    remove_network(client, session.network if session else f"{name}-outbound")
    return remove_volume_if_unused(client, session.volume if session else f"{name}-socket")


@dataclass
class PoolSettings:
    """How many sessions to keep idle, and how long one may sit unused before replacement."""

    size: int = 2
    idle_expiry_seconds: int = 600


class Keeper:
    """Keeps ``settings.size`` idle sessions; removes retired and abandoned ones.

    ``step()`` is one pass (tests drive it); ``serve()`` loops until ``stop`` is set, then
    removes the idle sessions it made (runs holding a claimed one keep theirs).
    """

    def __init__(
        self,
        client: Any,
        settings: PoolSettings,
        *,
        image: str | None = None,
        base: Path | None = None,
        log: Callable[[str], None] = lambda _line: None,
        store: StateStore | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.image = image or images.image_ref("egress-proxy")
        self.base = base or pool_dir()
        self.me = owner.current_owner()
        self.log = log
        self.stop = threading.Event()
        self.store = store
        # The store this keeper's state directory records runs in (its sweeps take these).
        self.owner_key = owner_key(store.location if store is not None else state_location())

    def _labels(self, name: str, component: str) -> dict[str, str]:
        return {
            owner.LABEL_OWNER: self.me,
            LABEL_STORE: self.owner_key,
            owner.LABEL_COMPONENT: component,
            LABEL_POOL: name,
            LABEL_POOL_DIR: str(self.base),
        }

    def start_one(self, ready_timeout: float = 60.0) -> PooledSession:
        """Create and start one idle session (deny-everything squid), and file it as idle."""
        import docker.types

        name = f"kagura-pool-{secrets.token_hex(6)}"
        volume, network, proxy_name = f"{name}-socket", f"{name}-outbound", f"{name}-proxy"
        session = PooledSession(
            name, "", proxy_name, volume, network, self.me, time.time(), self.image
        )
        try:
            with docker_errors(f"starting pooled egress session {name}"):
                self.client.volumes.create(
                    volume,
                    driver="local",
                    driver_opts=VOLUME_OPTS,
                    labels=self._labels(name, owner.COMPONENT_SOCKET),
                )
                self.client.networks.create(
                    network, driver="bridge", labels=self._labels(name, owner.COMPONENT_OUTBOUND)
                )
                environment = {
                    "KAGURA_SQUID_CONF_B64": base64.b64encode(deny_all_conf().encode()).decode(),
                    "KAGURA_EGRESS_SOCKET": f"{PROXY_SOCKET_DIR}/{SOCKET_NAME}",
                }
                mount = docker.types.Mount(PROXY_SOCKET_DIR, volume, type="volume", no_copy=True)
                proxy = self.client.containers.create(
                    self.image,
                    **proxy_create_kwargs(
                        name=proxy_name,
                        labels=self._labels(name, owner.COMPONENT_PROXY),
                        environment=environment,
                        network=network,
                        mounts=[mount],
                        stdin_open=False,
                        extra_hosts={},
                    ),
                )
                session = PooledSession(**{**asdict(session), "proxy_id": proxy.id})
                proxy.start()
            wait_for_ready(self.client, proxy.id, name, ready_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                remove_objects(self.client, session, name)
            raise
        write(self.base / IDLE / f"{name}.json", session)
        return session

    def _running(self) -> set[str]:
        label = f"{LABEL_POOL}"
        found = self.client.api.containers(all=True, filters={"label": label})
        return {c["Id"] for c in found if c.get("State") == "running"}

    def _drop(self, entry: Entry, why: str) -> None:
        session = entry.session()
        if session is not None and session.run_id and self.store is not None:
            # Used by a run (retired, or its claimer died): the rest of its decisions.
            with contextlib.suppress(Exception):
                finish_audit(self.client, session, self.store)
        try:
            complete = remove_objects(self.client, session, entry.name)
        except Exception as exc:  # left for the next pass / sweep
            self.log(f"removing {entry.name} failed ({why}): {exc}")
            return
        if not complete:
            return  # its volume is still mounted: the next pass
        forget(entry.path)
        self.log(f"removed {entry.name} ({why})")

    def step(self) -> None:
        """One pass: drop dead, expired, retired and abandoned sessions; refill."""
        running = self._running()
        now = time.time()
        idle = 0
        for entry in entries(self.base):
            session = entry.session()
            if entry.state == RETIRED:
                self._drop(entry, "used by a run")
            elif entry.state == CLAIMED:
                if not owner.owner_alive(entry.claimer):
                    self._drop(entry, "its run's process is gone")
            elif session is None or session.keeper != self.me:
                if session is None or not owner.owner_alive(session.keeper):
                    self._drop(entry, "its keeper is gone")
            elif session.proxy_id not in running:
                if self._take(entry):
                    self._drop(self._retired(entry), "its proxy died while idle")
            elif (
                now - session.created > self.settings.idle_expiry_seconds
                or session.image != self.image
            ):
                if self._take(entry):
                    self._drop(self._retired(entry), "idle too long")
            else:
                idle += 1
        while idle < self.settings.size and not self.stop.is_set():
            try:
                session = self.start_one()
            except Exception as exc:
                self.log(f"could not start a pooled session: {exc}")
                return
            idle += 1
            self.log(f"started {session.name}")

    def _retired(self, entry: Entry) -> Entry:
        return Entry(RETIRED, entry.name, "", self.base / RETIRED / f"{entry.name}.json")

    def _take(self, entry: Entry) -> bool:
        """Move an idle session out of reach of claims (a run may be taking it right now)."""
        target = self.base / RETIRED / f"{entry.name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry.path, target)
        except FileNotFoundError:
            return False
        return True

    def serve(self, interval: float = 0.5) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.stop.wait(interval)
        finally:
            self.drain()

    def drain(self) -> None:
        """Remove this keeper's idle and retired sessions (claimed ones stay with their runs)."""
        for entry in entries(self.base):
            session = entry.session()
            if entry.state == IDLE and session is not None and session.keeper == self.me:
                if self._take(entry):
                    self._drop(self._retired(entry), "the keeper stops")
            elif entry.state == RETIRED:
                self._drop(entry, "used by a run")


@contextlib.contextmanager
def keeper_thread(keeper: Keeper, interval: float = 0.2) -> Iterator[Keeper]:
    """Run ``keeper.serve`` in a thread (tests); drained on the way out."""
    thread = threading.Thread(
        target=keeper.serve, args=(interval,), name="egress-pool", daemon=True
    )
    thread.start()
    try:
        yield keeper
    finally:
        keeper.stop.set()
        thread.join(timeout=60)
