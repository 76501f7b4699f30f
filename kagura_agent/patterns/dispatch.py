"""Sub-agent dispatch with memory handoff.

The parent hands the child context as memories and passes their ids (the plan's
``task.parent = {"run", "context_memories"}``), never prompt text. At run time the
brain's ``dispatch`` tool (apply/midrun/dispatch.py) uses ``load_context`` for the memories it
chose, ``handoff`` for its notes, and ``child_outputs`` to read the child's result. The child's plan may
only narrow the parent's capabilities — ``narrowing_violations`` (pure, used by the
planner) lists every way it does not. The child records its output as memories that
cite its context; the parent reads them back by id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from kagura_agent.memory.model import Memory, MemoryStore, Source

CONTEXT = "context"
OUTPUT = "output"


def handoff(store: MemoryStore, *, parent_run: str, context: Sequence[str]) -> dict[str, Any]:
    """Store each context text as a memory; returns the plan's ``task.parent``.

    The texts are the parent agent's words (the ``notes`` of its dispatch request), so
    they are stored ``untrusted``: the child's plan counts them as untrusted inputs.
    """
    ids = [
        store.remember(
            type=CONTEXT,
            summary=text[:200],
            details={"text": text},
            source=Source("run", parent_run),
            tags=[f"parent:{parent_run}"],
            trust="untrusted",
        ).id
        for text in context
    ]
    return {"run": parent_run, "context_memories": ids}


def load_context(store: MemoryStore, memory_ids: Sequence[str]) -> list[Memory]:
    """The child's context, by id; a missing id is an error (the handoff was broken)."""
    found = []
    for memory_id in memory_ids:
        memory = store.get(memory_id)
        if memory is None:
            raise KeyError(f"context memory {memory_id} does not exist (forgotten?)")
        found.append(memory)
    return found


def record_output(
    store: MemoryStore,
    *,
    child_run: str,
    parent: Mapping[str, Any],
    summary: str,
    details: Mapping[str, Any] | None = None,
) -> Memory:
    """Store a child's result, citing its context (``derived_from`` edges and details.cites).

    ``parent`` is the plan's ``task.parent`` (``run``, ``task``, ``context_memories``).
    A context memory forgotten since planning is listed as missing rather than cited.
    Stored ``untrusted``: its details carry verify output tails, text the agent shaped.
    """
    context = list(parent.get("context_memories") or [])
    cites = [memory_id for memory_id in context if store.get(memory_id) is not None]
    missing = [memory_id for memory_id in context if memory_id not in cites]
    tags = [f"parent:{parent[key]}" for key in ("run", "task") if parent.get(key)]
    output = store.remember(
        type=OUTPUT,
        summary=summary,
        source=Source("run", child_run),
        details={
            **(details or {}),
            "cites": cites,
            "parent_run": parent.get("run"),
            "parent_task": parent.get("task"),
            **({"missing_context": missing} if missing else {}),
        },
        tags=tags,
        trust="untrusted",
    )
    for memory_id in cites:
        store.create_edge(output.id, memory_id, "derived_from")
    return output


def child_outputs(store: MemoryStore, output_ids: Sequence[str]) -> list[Memory]:
    """The parent reads its children's outputs by id (missing ones are skipped)."""
    return [m for m in map(store.get, output_ids) if m is not None]


def narrowing_violations(
    parent_plan: Mapping[str, Any], child_plan: Mapping[str, Any]
) -> list[str]:
    """Every capability the child plan has that the parent plan does not (empty: narrowed).

    Egress entries (host, port, scheme) and allowed private ranges must be the parent's;
    credentials must be a (provider, scope) the parent holds with no longer ttl; mounts
    must lie within a parent mount, and be read-only where the parent's is — a child
    rooted at (or over) what the parent had protected read-only (its task file, its
    ``.git``) would write what the operator trusts next; tool servers must be ones the
    parent had.
    """
    parent_tools = {s["name"] for s in parent_plan.get("tool_servers") or []}
    return [
        *_egress(parent_plan.get("egress") or {}, child_plan.get("egress") or {}),
        *[
            f"tool server {s['name']} is not one the parent had"
            for s in child_plan.get("tool_servers") or []
            if s["name"] not in parent_tools
        ],
        *_credentials(parent_plan.get("credentials") or [], child_plan.get("credentials") or []),
        *_mounts(parent_plan.get("mounts") or [], child_plan.get("mounts") or []),
    ]


def _egress(parent: Mapping[str, Any], child: Mapping[str, Any]) -> list[str]:
    found = []
    allowed = {(e["host"], e["port"], e.get("scheme")) for e in parent.get("allow", [])}
    for entry in child.get("allow", []):
        if (entry["host"], entry["port"], entry.get("scheme")) not in allowed:
            found.append(
                f"egress {entry.get('scheme')}://{entry['host']}:{entry['port']}"
                " is not allowed to the parent"
            )
    for cidr in child.get("allow_addresses", []):
        if cidr not in parent.get("allow_addresses", []):
            found.append(f"egress address range {cidr} is not allowed to the parent")
    if child.get("mode") == "proxy" and parent.get("mode", "none") == "none":
        found.append("egress mode proxy widens the parent's mode none")
    return found


def _credentials(
    parent: Sequence[Mapping[str, Any]], child: Sequence[Mapping[str, Any]]
) -> list[str]:
    held = {(c["provider"], c["scope"]): c for c in parent if c.get("class") != "denied"}
    found = []
    for cred in child:
        key = (cred["provider"], cred["scope"])
        if key not in held:
            found.append(f"credential {key[0]}/{key[1]} is not held by the parent")
        elif int(cred.get("ttl_seconds") or 0) > int(held[key].get("ttl_seconds") or 0):
            found.append(
                f"credential {key[0]}/{key[1]} ttl {cred.get('ttl_seconds')}s exceeds the"
                f" parent's {held[key].get('ttl_seconds')}s"
            )
    return found


def _within(path: str, root: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(root))


def _mounts(parent: Sequence[Mapping[str, Any]], child: Sequence[Mapping[str, Any]]) -> list[str]:
    found = []
    for mount in child:
        if mount.get("kind") == "protected":
            continue  # read-only over the child's own root: it takes access away, never adds
        covering = [p for p in parent if _within(mount["source"], p["source"])]
        if not covering:
            found.append(f"mount {mount['source']} is outside every parent mount")
            continue
        if mount.get("mode") != "rw":
            continue
        guard = _guard(parent, mount["source"])
        if guard is None or guard.get("mode") != "rw":
            why = f" ({guard['protects']})" if guard and guard.get("protects") else ""
            found.append(f"mount {mount['source']} is rw but read-only in the parent{why}")
        held = [m["source"] for m in child if m.get("kind") == "protected"]
        for kept in parent:
            if (
                kept.get("mode") == "ro"
                and kept.get("kind") != "extra"
                and kept["source"] != mount["source"]
                and _within(kept["source"], mount["source"])
                and not any(_within(kept["source"], h) for h in held)
            ):
                found.append(
                    f"mount {mount['source']} makes {kept['source']} writable, read-only in"
                    f" the parent ({kept.get('protects') or 'read-only'})"
                )
    return found


def _guard(parent: Sequence[Mapping[str, Any]], source: str) -> Mapping[str, Any] | None:
    """The parent mount that decides whether the parent may write ``source``: the deepest
    project or protected mount covering it (a protected entry is read-only over the
    writable root). An ``extra`` mount is another, read-only view elsewhere: it never
    decides what the project root lets the parent write."""
    view = [p for p in parent if p.get("kind") != "extra" and _within(source, p["source"])]
    return max(view, key=lambda p: len(PurePosixPath(p["source"]).parts), default=None)
