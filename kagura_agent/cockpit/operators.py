"""Who may approve: the operators of a Transport manifest (the cockpit's, and the web
console's when it answers approvals).

A chat transport lists its operators' user ids (``spec.operators``); the terminal
transport's operator is also whoever runs it (``operator_name``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kagura_agent.approvals import operator_name
from kagura_agent.errors import UsageError
from kagura_agent.manifest.catalog import Catalog


@dataclass(frozen=True)
class Operators:
    transport: str  # the Transport manifest's name
    kind: str  # cli | slack | discord
    spec: dict[str, Any]
    ids: frozenset[str]


def transport_operators(catalog: Catalog, name: str | None) -> Operators:
    """The named Transport manifest (or the default one) and its operators; a UsageError
    when there is no such manifest or it lists nobody."""
    if name:
        manifest = catalog.get("Transport", name)
        if manifest is None:
            known = ", ".join(catalog.names("Transport")) or "none"
            raise UsageError(f"no Transport named {name!r} (have: {known})")
    else:
        manifest = catalog.default("Transport")
        if manifest is None:
            raise UsageError(
                "more than one Transport and none is the default",
                hint="pass --transport NAME",
            )
    spec = dict(manifest.spec)
    ids = set(spec.get("operators") or [])
    if spec["type"] == "cli":
        ids.add(operator_name())
    elif not ids:
        raise UsageError(
            f"Transport {manifest.name} lists no operators",
            hint="set spec.operators to the chat user ids allowed to launch and approve",
        )
    return Operators(manifest.name, str(spec["type"]), spec, frozenset(ids))
