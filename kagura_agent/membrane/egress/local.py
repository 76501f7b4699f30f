"""A model endpoint on this machine: the network the run's proxy joins for it, checked.

A Brain's ``endpoint.local`` (manifest/endpoint.py) names a container on a Docker network
instead of a URL. The run's proxy joins that network before it starts, and only the proxy:
the agent's container has no network of its own (its only way out is the proxy's socket),
so its model calls reach the endpoint through the key-injecting port and nothing else.
Joining must not widen what the proxy can reach, so the network has to be internal (no
route off the machine), and the container has to be on it; both are checked right before
the proxy is created, against the daemon, and refused with what to do otherwise.
"""

from __future__ import annotations

from typing import Any

from kagura_agent.errors import RefusedError
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.plan.model import LocalEndpoint, Plan


def local_endpoint(plan: Plan) -> LocalEndpoint | None:
    """The plan's local model endpoint, if its brain has one."""
    endpoint = plan["brain"].get("model_endpoint")
    return endpoint.get("local") if endpoint is not None else None


def proxy_networks(client: Any, plan: Plan) -> tuple[str, ...]:
    """The networks the run's proxy joins for the plan's local model endpoint (none when it
    has none), each checked: it exists, it is internal, the endpoint's container is on it."""
    import docker.errors

    local = local_endpoint(plan)
    if local is None:
        return ()
    name, container = local["network"], local["container"]
    where = f"the brain's local model endpoint (network {name}, container {container})"
    with docker_errors(f"inspecting Docker network {name}"):
        try:
            attrs = client.networks.get(name).attrs
        except docker.errors.NotFound:
            raise RefusedError(
                f"{where}: Docker network {name!r} does not exist; start the endpoint first"
            ) from None
    if not attrs.get("Internal"):
        raise RefusedError(
            f"{where}: network {name!r} is not internal, so joining it would give the run's"
            f" proxy a route around its allowlist; recreate it with"
            f" `docker network create --internal {name}`"
        )
    names = {str(c.get("Name", "")) for c in (attrs.get("Containers") or {}).values()}
    if container not in names:
        raise RefusedError(f"{where}: no running container {container!r} is on network {name!r}")
    return (name,)
