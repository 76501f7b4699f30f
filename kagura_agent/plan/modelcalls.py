"""The plan's model-call policy: what the brain's model calls may ask the provider to reach.

When the proxy injects the brain's key (plan/injection.py), the agent's only way to the
model is the key-injecting port (membrane/egress/modelport.py), which holds every call to
``egress.model_calls``: the paths it offers, the server-side tools, MCP connectors, URL
sources and files the provider may use for the agent (none unless an EgressPolicy's
``model_calls`` allows them: the provider reaching out is egress like any host), the
anthropic-beta names, and how calls are capped when they start.

The model host itself is reached through that port only: an allowlist entry naming it
(a tunnel on the forward port, opaque and unaudited, where an attacker's key would reach
an attacker's account) is left out unless a policy says ``model_calls.tunnel: true``,
and the plan says which. Pure: the planner calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kagura_agent.manifest.catalog import Manifest
from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.membrane.egress.modelport import (
    API_PATHS,
    DEFAULT_CONCURRENCY,
    FEATURE_BETAS,
    FILE_PATHS,
    FREE_CALLS_PER_TURN,
    LOCAL_BETAS,
    OAUTH_BETAS,
    SIDE_CALLS_PER_TURN,
    Injection,
)
from kagura_agent.plan.model import EgressSection, ModelCallsSection, ModelEndpointBase


def _layer(layer: str) -> str:
    return "packaged" if layer == "packaged" else "operator"


def model_calls(
    egress: EgressSection, policies: Sequence[Manifest], endpoint: ModelEndpointBase
) -> tuple[EgressSection, list[str]]:
    """``egress`` with its ``model_calls`` section, and the plan's warnings about it, for
    the brain's model ``endpoint`` (plan/endpoint.py)."""
    upstream = Injection.for_endpoint(endpoint)
    server_tools: list[str] = []
    mcp_servers: list[str] = []
    betas: list[str] = [*LOCAL_BETAS, *(OAUTH_BETAS if endpoint["auth"] == "oauth" else ())]
    url_sources = files = False
    concurrency: int | None = None
    tunnel: list[str] = []
    grants: list[dict[str, Any]] = []
    for policy in policies:
        spec = policy.spec.get("model_calls")
        if spec is None:
            continue
        allows: list[str] = []
        for tool in spec.get("server_tools", []):
            allows.append(tool)
            if tool not in server_tools:
                server_tools.append(tool)
            betas += FEATURE_BETAS.get(tool, ())
        for raw in spec.get("mcp_servers", []):
            host, _ = normalize_host(raw)
            assert host is not None  # validated before planning
            allows.append(f"MCP server {host}")
            if host not in mcp_servers:
                mcp_servers.append(host)
            betas += FEATURE_BETAS["mcp"]
        if spec.get("url_sources"):
            url_sources = True
            allows.append("URL sources")
        if spec.get("files"):
            files = True
            allows.append("files")
            betas += FEATURE_BETAS["files"]
        betas += spec.get("betas", [])
        allows += [f"beta {b}" for b in spec.get("betas", [])]
        if "concurrency" in spec:
            concurrency = max(concurrency or 0, int(spec["concurrency"]))
            allows.append(f"{spec['concurrency']} calls at once")
        if spec.get("tunnel"):
            tunnel.append(policy.name)
            allows.append(f"a tunnel to {upstream.host}")
        grants.append(
            {
                "policy": policy.name,
                "allows": allows,
                "source": policy.file,
                "layer": _layer(policy.layer),
            }
        )
    warnings: list[str] = []
    allow = egress["allow"]
    left_out = sorted({e["policy"] for e in allow if e["host"] == upstream.host})
    if left_out and not tunnel:
        allow = [e for e in allow if e["host"] != upstream.host]
        warnings.append(
            f"{upstream.host} (policy {', '.join(left_out)}) is the model host: it is reached"
            " only through the key-injecting port, its tunnel on the forward port is left out"
            " (an EgressPolicy with model_calls.tunnel: true keeps it)"
        )
    elif tunnel:
        warnings.append(
            f"a tunnel to the model host {upstream.host} is allowed beside the key-injecting"
            f" port (policy {', '.join(tunnel)}): what passes it is neither checked nor counted"
        )
    files = files and upstream.api == "anthropic"  # the Files API is Anthropic's own
    section: ModelCallsSection = {
        "upstream": f"{'https' if upstream.tls else 'http'}://{upstream.host}:{upstream.port}"
        + upstream.base_path,
        "credential": endpoint["credential"],
        "paths": [*API_PATHS[upstream.api], *(FILE_PATHS if files else ())],
        "server_tools": sorted(server_tools),
        "mcp_servers": sorted(mcp_servers),
        "url_sources": url_sources,
        "files": files,
        "betas": sorted(set(betas)),
        "concurrency": concurrency or DEFAULT_CONCURRENCY,
        "side_calls_per_turn": SIDE_CALLS_PER_TURN,
        "free_calls_per_turn": FREE_CALLS_PER_TURN,
        "tunnel": tunnel,
        "grants": grants,
    }
    out: EgressSection = {**egress, "allow": allow}
    out["model_calls"] = section
    return out, warnings
