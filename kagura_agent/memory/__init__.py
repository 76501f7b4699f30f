"""Memory: the protocol, the embedded SQLite store, the cloud backend, and the startup gate.

open_memory(plan["memory"]) -> MemoryStore      # sqlite (default) or cloud
check_ready(plan["memory"])                     # SetupError (exit 3) when unusable
"""

from kagura_agent.memory.factory import open_memory
from kagura_agent.memory.gate import check_ready
from kagura_agent.memory.model import (
    EDGE_TYPES,
    Edge,
    Memory,
    MemoryStore,
    Source,
    Tombstone,
    Trust,
    default_trust,
    untrusted_ids,
)

__all__ = [
    "EDGE_TYPES",
    "Edge",
    "Memory",
    "MemoryStore",
    "Source",
    "Tombstone",
    "Trust",
    "check_ready",
    "default_trust",
    "open_memory",
    "untrusted_ids",
]
