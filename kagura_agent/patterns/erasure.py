"""Erasure: forget a memory and, with cascade, everything derived from it.

A memory is derived from X when it has a ``derived_from`` edge to X or lists X in
``details.cites``. Cascade follows derivations transitively. Every removed memory
leaves a tombstone (id, type, provenance, times, reason — no content), so the erasure
itself stays auditable.
"""

from __future__ import annotations

import re

from kagura_agent.memory.model import MemoryStore, Tombstone


def derived_from(store: MemoryStore, memory_id: str) -> list[str]:
    """Ids of memories that cite ``memory_id`` (edges first, then details.cites)."""
    found = [e.source_id for e in store.edges(memory_id, type="derived_from", direction="in")]
    # details.cites is found by full-text search on the id's most distinctive token,
    # then confirmed exactly; untrusted memories can cite too, so include them.
    tokens = re.findall(r"\w+", memory_id)
    if tokens:
        for memory in store.recall(max(tokens, key=len), k=1000, include_untrusted=True):
            cites = memory.details.get("cites")
            if isinstance(cites, list) and memory_id in cites and memory.id not in found:
                found.append(memory.id)
    return found


def forget(
    store: MemoryStore, memory_id: str, *, cascade: bool = False, reason: str = ""
) -> list[Tombstone]:
    """Forget ``memory_id`` (and with ``cascade`` its derivations); returns the tombstones.

    Derivations are collected before anything is removed, because removing a memory
    removes the edges that lead to them. Returns [] when the memory does not exist.
    """
    if store.get(memory_id) is None:
        return []
    order = [memory_id]
    if cascade:
        seen = {memory_id}
        queue = [memory_id]
        while queue:
            for child in derived_from(store, queue.pop(0)):
                if child not in seen:
                    seen.add(child)
                    order.append(child)
                    queue.append(child)
    tombstones = []
    for target in order:
        tombstone = store.forget(
            target,
            reason=reason or ("erased" if target == memory_id else f"derived from {memory_id}"),
            cascade_of=None if target == memory_id else memory_id,
        )
        if tombstone is not None:
            tombstones.append(tombstone)
    return tombstones
