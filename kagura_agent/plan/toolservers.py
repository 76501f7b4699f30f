"""The plan's ``tool_servers`` section and the egress entries of http tool servers (pure).

Each requested ToolServer becomes one entry with its capability category
``toolserver:<name>`` (classified like any capability: baseline, graduated,
needs-approval or denied). An http server's endpoint joins ``egress.allow`` with
``policy: toolserver:<name>``, so the run's proxy lets exactly that host and port through.
"""

from __future__ import annotations

from collections.abc import Sequence

from kagura_agent.manifest.catalog import Manifest
from kagura_agent.manifest.toolservers import endpoint
from kagura_agent.plan.model import EgressRule, Layer, Scheme, ToolServerBase

PREFIX = "toolserver:"


def category(name: str) -> str:
    return PREFIX + name


def _layer(layer: str) -> Layer:
    return "packaged" if layer == "packaged" else "operator"


def tool_server_sections(servers: Sequence[Manifest]) -> list[ToolServerBase]:
    """One plan entry per requested tool server, in the task's order."""
    found: list[ToolServerBase] = []
    for server in servers:
        spec = server.spec
        stdio = spec["transport"] == "stdio"
        point = None if stdio else endpoint(spec["url"])[0]
        found.append(
            {
                "name": server.name,
                "transport": "stdio" if stdio else "http",
                "image": spec["image"] if stdio else None,
                "command": [spec["command"], *spec.get("args", [])] if stdio else None,
                "env": dict(spec.get("env", {})) if stdio else {},
                "url": None if stdio else spec["url"],
                "host": point.host if point else None,
                "port": point.port if point else None,
                "category": category(server.name),
                "source": server.file,
                "layer": _layer(server.layer),
            }
        )
    return found


def tool_server_rules(servers: Sequence[Manifest]) -> list[EgressRule]:
    """The egress entries the http tool servers need (validated before planning)."""
    rules: list[EgressRule] = []
    for server in servers:
        if server.spec["transport"] != "http":
            continue
        point, _ = endpoint(server.spec["url"])
        assert point is not None  # checked at validate
        scheme: Scheme = "http" if point.scheme == "http" else "https"
        rules.append(
            {
                "host": point.host,
                "port": point.port,
                "scheme": scheme,
                "allow_addresses": list(server.spec.get("allow_addresses", [])),
                "policy": category(server.name),
                "source": server.file,
                "layer": _layer(server.layer),
            }
        )
    return rules


def rule_category(policy: str) -> str:
    """The capability category an ``egress.allow`` entry is granted under."""
    return policy if policy.startswith(PREFIX) else f"egress:{policy}"
