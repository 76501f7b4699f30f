"""Remove egress networks, socket volumes and proxies left behind by runs whose process is gone.

A ``kill -9`` of the applying process skips every ``finally``; its proxy and networks stay
behind, labelled with the dead owner. ``sweep_orphans`` runs at every session start: it
first salvages the dead proxy's audit log into the state store, then removes the proxy,
the networks and the socket volume (disconnecting anything still attached).

A sweep takes only the objects of its own store (``LABEL_STORE``, state.owner_key): state
directories sharing one Docker daemon never remove each other's objects, live or dead,
nor race each other's sweeps. ``everyone=True`` (``kagura-agent egress sweep --all``, an
operator's choice) takes every dead owner's objects on the daemon, those an earlier
kagura-agent left without the label included, and the agent containers of dead runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kagura_agent.membrane.egress import audit, owner
from kagura_agent.membrane.egress import poolfiles as pool
from kagura_agent.membrane.egress.policy import EgressPolicy, load_policy
from kagura_agent.membrane.hardening import LABEL_RUN, LABEL_STORE
from kagura_agent.state import StateStore, owner_key, state_location

_COMPONENTS = (owner.COMPONENT_INTERNAL, owner.COMPONENT_OUTBOUND)


def remove_network(client: Any, name_or_id: str) -> None:
    """Disconnect every container still attached, then remove the network (gone is fine)."""
    import docker.errors

    # Usually nothing is attached any more (the proxy is gone): one request. Only when
    # the daemon refuses (active endpoints) are the stragglers looked up and detached.
    try:
        client.api.remove_network(name_or_id)
        return
    except docker.errors.NotFound:
        return
    except docker.errors.APIError:
        pass
    try:
        network = client.networks.get(name_or_id)
    except docker.errors.NotFound:
        return
    for container_id in network.attrs.get("Containers") or {}:
        with contextlib.suppress(docker.errors.NotFound):
            network.disconnect(container_id, force=True)
    with contextlib.suppress(docker.errors.NotFound):
        network.remove()


def remove_volume_if_unused(client: Any, name: str) -> bool:
    """Remove a volume; False when a container still mounts it (gone counts as removed)."""
    import docker.errors

    try:
        client.api.remove_volume(name)
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # in use
            return False
        raise
    return True


def salvage(client: Any, container_id: str, run_id: str, store: StateStore) -> None:
    """Store the decisions in a (stopped) proxy's log that ``run_id`` had not stored yet.

    The run's redactor, which knew the values it leased, died with it, and the agent
    chose a request's host and path (a denied ``CONNECT`` to ``<its token>.example.net``):
    each decision is stored with what the agent chose withheld (audit.withheld)."""
    if not run_id:
        return
    allowlist = audit.run_allowlist(store, run_id)
    if allowlist is None:
        # A run this store never recorded: another state directory's (every sweep on the
        # Docker host sees every dead proxy). Its decisions are not this store's to keep.
        return
    try:
        policy = load_policy(allowlist)
    except Exception:
        policy = EgressPolicy(mode="proxy")
    # Read as a stream and at most audit.LOG_CEILING bytes far (past it the run was a
    # flood), a batch of decisions at a time: the agent chose how long the log is.
    stream = client.api.logs(container_id, stdout=True, stderr=False, stream=True, follow=False)
    try:
        lines = audit.log_lines(stream)
        events = audit.events_from_lines(lines, policy, run_id)
        for batch in audit.batched(audit.withheld(event, policy) for event in events):
            audit.record_events(store, batch)
    finally:
        with contextlib.suppress(Exception):
            stream.close()


def sweep_orphans(
    client: Any,
    store: StateStore | None = None,
    *,
    everyone: bool = False,
    is_alive: Callable[[str], bool] = owner.owner_alive,
) -> list[str]:
    """Remove egress proxies and networks whose owning process is gone; return their names.

    Only ``store``'s own objects (the configured store's without one), unless
    ``everyone``: then every dead owner's on the daemon, and the containers of dead runs.
    With ``store``, each dead proxy's decisions are saved (idempotently) before removal.
    Uses the list endpoints only (no per-object inspect), so objects that other runs
    remove concurrently cannot make the sweep fail.
    """
    import docker.errors

    mine = [] if everyone else [f"{LABEL_STORE}={_key(store)}"]

    # A pooled session answers to its pool file (pool.py): its claiming run while one holds
    # it, else its keeper. Objects with no pool file go by their owner label.
    pools: dict[str, tuple[dict[str, bool], dict[str, str]]] = {}

    def pool_of(labels: dict[str, str]) -> tuple[dict[str, bool], dict[str, str]]:
        where = labels.get(pool.LABEL_POOL_DIR, "")
        if where not in pools:
            base = Path(where) if where else None
            pools[where] = (
                (pool.names_alive(base, is_alive=is_alive), pool.claimed_runs(base))
                if base is not None
                else ({}, {})
            )
        return pools[where]

    def alive(labels: dict[str, str]) -> bool:
        name = labels.get(pool.LABEL_POOL, "")
        pooled = pool_of(labels)[0] if name else {}
        if name in pooled:
            return pooled[name]
        return is_alive(labels.get(owner.LABEL_OWNER, ""))

    def run_of(labels: dict[str, str]) -> str:
        return labels.get(LABEL_RUN, "") or pool_of(labels)[1].get(
            labels.get(pool.LABEL_POOL, ""), ""
        )

    # This state directory's own pool: its stale files go even when no object is left.
    pool_of({pool.LABEL_POOL_DIR: str(pool.pool_dir())})
    removed: list[str] = []
    label = f"{owner.LABEL_COMPONENT}={owner.COMPONENT_PROXY}"
    for summary in client.api.containers(all=True, filters={"label": [label, *mine]}):
        labels = summary.get("Labels") or {}
        if alive(labels):
            continue
        if store is not None:
            run_id = run_of(labels)
            # Salvage is best effort; removing the orphan is not.
            with contextlib.suppress(Exception):
                salvage(client, summary["Id"], run_id, store)
        try:
            client.api.remove_container(summary["Id"], force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # 409: another apply's sweep is removing this orphan right now; it is theirs.
            if exc.status_code != 409:
                raise
            continue
        removed.append((summary.get("Names") or [summary["Id"]])[0].lstrip("/"))
    for component in _COMPONENTS:
        label = f"{owner.LABEL_COMPONENT}={component}"
        for summary in client.api.networks(filters={"label": [label, *mine]}):
            if alive(summary.get("Labels") or {}):
                continue
            remove_network(client, summary["Id"])
            removed.append(summary["Name"])
    label = f"{owner.LABEL_COMPONENT}={owner.COMPONENT_SOCKET}"
    kept: set[str] = set()
    for volume in client.api.volumes(filters={"label": [label, *mine]}).get("Volumes") or []:
        labels = volume.get("Labels") or {}
        if alive(labels):
            continue
        # A volume still mounted by a container is left for the next sweep.
        if remove_volume_if_unused(client, volume["Name"]):
            removed.append(volume["Name"])
        else:
            kept.add(labels.get(pool.LABEL_POOL, ""))
    # Pool files of sessions removed here go too (a kept volume keeps its file: next time).
    for where, (pooled, _runs) in pools.items():
        if where:
            dead = {name for name, live in pooled.items() if not live} - kept
            pool.forget_dead(dead, Path(where))
    if everyone:
        removed += _dead_run_containers(client, is_alive)
    return removed


def _key(store: StateStore | None) -> str:
    return owner_key(store.location if store is not None else state_location())


def _dead_run_containers(client: Any, is_alive: Callable[[str], bool]) -> list[str]:
    """Remove the run containers (agent, verify) whose applying process is gone, whatever
    store recorded them; that store's next sweep still clears their roots and rows."""
    import docker.errors

    removed = []
    found = client.api.containers(all=True, filters={"label": [LABEL_RUN, owner.LABEL_OWNER]})
    for summary in found:
        labels = summary.get("Labels") or {}
        if owner.LABEL_COMPONENT in labels or is_alive(labels.get(owner.LABEL_OWNER, "")):
            continue
        try:
            client.api.remove_container(summary["Id"], force=True)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: being removed by someone else right now
                raise
            continue
        removed.append((summary.get("Names") or [summary["Id"]])[0].lstrip("/"))
    return removed
