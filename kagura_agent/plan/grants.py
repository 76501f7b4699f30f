"""What a plan grants beyond the container: the egress allowlist (the task's policies,
then its http tool servers), the proxy image that enforces it, and each credential's
entry; with the plan's name for the layer each comes from. Pure, like the rest of the
planner."""

from __future__ import annotations

from typing import Any

from kagura_agent.facts import Facts
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.manifest.proxyimage import proxy_image
from kagura_agent.plan.model import (
    CredentialBase,
    EgressRule,
    EgressSection,
    Layer,
    ProxyPin,
    Scheme,
)


def layer_of(layer: str) -> Layer:
    """The plan's name for a manifest's layer (only the two layers grant anything)."""
    return "packaged" if layer == "packaged" else "operator"


def proxy_pin(catalog: Catalog, facts: Facts) -> ProxyPin:
    """The egress proxy image, pinned as the agent image is (planner ``_image``)."""
    proxy = proxy_image(catalog)
    digest = facts.image_digests.get(proxy.tag)
    pull = facts.image_pulls.get(proxy.tag) if proxy.repository and digest else None
    return {"ref": proxy.tag, "digest": digest, "pull": pull}


def egress_section(
    policies: list[Manifest], tool_rules: list[EgressRule], pool: bool
) -> EgressSection:
    """The allowlist: every entry of the task's policies, then its http tool servers'."""
    allow: list[EgressRule] = []
    seen: set[tuple[str, int, str]] = set()
    addresses: list[str] = []
    for policy in policies:
        for entry in policy.spec.get("allow", []):
            host, _ = normalize_host(entry["host"])
            assert host is not None  # validated before planning
            schemes: list[Scheme] = ["https", "http"] if entry.get("http") else ["https"]
            for port in entry.get("ports", [443]):
                for scheme in schemes:
                    key = (host, port, scheme)
                    if key in seen:
                        continue
                    seen.add(key)
                    allow.append(
                        {
                            "host": host,
                            "port": port,
                            "scheme": scheme,
                            "allow_addresses": list(entry.get("allow_addresses", [])),
                            "policy": policy.name,
                            "source": policy.file,
                            "layer": layer_of(policy.layer),
                        }
                    )
            for cidr in entry.get("allow_addresses", []):
                if cidr not in addresses:
                    addresses.append(cidr)
    for rule in tool_rules:
        key = (rule["host"], rule["port"], rule["scheme"])
        if key not in seen:
            seen.add(key)
            allow.append(rule)
        for cidr in rule["allow_addresses"]:
            if cidr not in addresses:
                addresses.append(cidr)
    allow.sort(key=lambda e: (e["host"], e["port"], e["scheme"]))
    # A policy of model calls needs the proxy (its key-injecting port) even with no host.
    calls = any(p.spec.get("model_calls") is not None for p in policies)
    return {
        "mode": "proxy" if allow or calls else "none",
        "allow": allow,
        "allow_addresses": addresses,
        "policies": [p.name for p in policies],
        # Whether apply may hand this run a pooled (warm) proxy session if one is idle.
        "pool": bool(allow) and pool,
    }


def credential_entry(request: Any) -> CredentialBase:
    provider: Manifest = request.provider
    spec = provider.spec
    return {
        "name": f"{provider.name}-{request.scope}",
        "provider": provider.name,
        "type": spec["type"],
        "scope": request.scope,
        # Provider settings (endpoint, region, app id…) then the scope's own keys: what the
        # provider needs to mint, and nothing secret (the root secret is a reference).
        "scope_spec": {
            **spec.get(_settings_key(spec["type"]), {}),
            **{k: v for k, v in spec["scopes"][request.scope].items() if k != "description"},
        },
        "ttl_seconds": request.ttl_seconds,
        "renewals": request.renewals,
        "budget_seconds": request.budget_seconds,
        "secret_ref": spec["secret"],
        "standing": bool(spec.get("standing", False)),
        "category": f"credential:{provider.name}/{request.scope}",
        "source": provider.file,
        "layer": layer_of(provider.layer),
    }


def _settings_key(kind: str) -> str:
    return {"aws-sts": "aws", "github-app": "github"}.get(kind, kind)
