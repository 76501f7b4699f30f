"""Remove egress networks and proxies left behind by runs whose process is gone.

A ``kill -9`` of the applying process skips every ``finally``; its proxy and networks stay
behind, labelled with the dead owner. ``sweep_orphans`` runs at every session start: it
first salvages the dead proxy's audit log into the state store, then removes the proxy
and the networks (disconnecting anything still attached).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kagura_agent.membrane.egress import audit, owner
from kagura_agent.membrane.egress.policy import EgressPolicy, load_policy
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.state import StateStore

_COMPONENTS = (owner.COMPONENT_INTERNAL, owner.COMPONENT_OUTBOUND)


def remove_network(client: Any, name_or_id: str) -> None:
    """Disconnect every container still attached, then remove the network (gone is fine)."""
    import docker.errors

    try:
        network = client.networks.get(name_or_id)
    except docker.errors.NotFound:
        return
    for container_id in network.attrs.get("Containers") or {}:
        with contextlib.suppress(docker.errors.NotFound):
            network.disconnect(container_id, force=True)
    with contextlib.suppress(docker.errors.NotFound):
        network.remove()


def _salvage(container: Any, store: StateStore) -> None:
    run_id = container.labels.get(LABEL_RUN, "")
    if not run_id:
        return
    allowlist = audit.run_allowlist(store, run_id)
    try:
        policy = load_policy(allowlist) if allowlist else EgressPolicy(mode="proxy")
    except Exception:
        policy = EgressPolicy(mode="proxy")
    text = container.logs(stdout=True, stderr=False).decode(errors="replace")
    audit.record_events(store, audit.events_from_log(text, policy, run_id))


def sweep_orphans(
    client: Any,
    store: StateStore | None = None,
    *,
    is_alive: Callable[[str], bool] = owner.owner_alive,
) -> list[str]:
    """Remove egress proxies and networks whose owning process is gone; return their names.

    With ``store``, each dead proxy's decisions are saved (idempotently) before removal.
    """
    removed: list[str] = []
    proxies = client.containers.list(
        all=True, filters={"label": f"{owner.LABEL_COMPONENT}={owner.COMPONENT_PROXY}"}
    )
    for container in proxies:
        if is_alive(container.labels.get(owner.LABEL_OWNER, "")):
            continue
        if store is not None:
            # Salvage is best effort; removing the orphan is not.
            with contextlib.suppress(Exception):
                _salvage(container, store)
        container.remove(force=True)
        removed.append(container.name)
    for component in _COMPONENTS:
        networks = client.networks.list(filters={"label": f"{owner.LABEL_COMPONENT}={component}"})
        for network in networks:
            if is_alive(network.attrs.get("Labels", {}).get(owner.LABEL_OWNER, "")):
                continue
            remove_network(client, network.id)
            removed.append(network.name)
    return removed
