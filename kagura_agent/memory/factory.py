"""Pick the memory backend the launch plan's ``memory`` section names, and open it.

The section (docs/plan-format.md) looks like::

    {"name": "default", "backend": "sqlite" | "cloud" | "postgres",
     "location": "state-dir" | "/abs/memory.db" | "https://…/mcp" | "state-store",
     "token_ref": null | "env:KAGURA_MEMORY_TOKEN" | "file:/path" | "keyring:SERVICE/USER",
     "context_id": "…"}            # cloud only; defaults to "kagura-agent"

Secrets arrive as references; the caller may pass the resolved token instead.
``postgres`` keeps memories in the team's state store (the State manifest's, or
``KAGURA_AGENT_STATE_URL``): its URL, which may carry a password, is a reference in the
manifest or the operator's environment, never written in a manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kagura_agent.clock import Clock
from kagura_agent.errors import SetupError, UsageError
from kagura_agent.membrane.secrets import parse_secret_ref, resolve
from kagura_agent.memory.model import MemoryStore
from kagura_agent.memory.postgres import PgMemoryStore
from kagura_agent.memory.sqlite import SqliteMemoryStore
from kagura_agent.paths import sqlite_path
from kagura_agent.state import URL_ENV, state_location

DEFAULT_CONTEXT = "kagura-agent"
STATE_STORE = "state-store"  # the postgres backend's location: the state store's database
DEFAULT_SECTION: dict[str, Any] = {"name": "default", "backend": "sqlite", "location": "state-dir"}


def section_from_manifest(name: str | None, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plan's ``memory`` section for a Memory manifest (None: the embedded default)."""
    if spec is None:
        return {**DEFAULT_SECTION, "name": name or "embedded", "token_ref": None}
    backend = spec["backend"]
    locations = {"cloud": spec.get("url"), "postgres": STATE_STORE}
    return {
        "name": name,
        "backend": backend,
        "location": locations.get(backend, spec.get("path", "state-dir")),
        "token_ref": spec.get("token"),
    }


def resolve_token(token_ref: str | None) -> str:
    """Resolve the token reference (env:, file: or keyring:) the way every secret is
    resolved (membrane.secrets); the value is never logged or stored."""
    if not token_ref:
        raise SetupError(
            "the cloud memory backend needs a token reference",
            hint="set token (env:NAME, file:PATH or keyring:SERVICE/USER) in the memory manifest",
        )
    parsed = parse_secret_ref(token_ref)
    if isinstance(parsed, str):
        raise UsageError(f"memory token: {parsed}")
    return resolve(parsed)


def open_memory(
    memory_plan_section: Mapping[str, Any] | None = None,
    *,
    clock: Clock | None = None,
    token: str | None = None,
) -> MemoryStore:
    """Open the backend the plan's ``memory`` section selects (embedded SQLite by default)."""
    section = memory_plan_section or DEFAULT_SECTION
    backend = section.get("backend", "sqlite")
    if backend == "sqlite":
        return SqliteMemoryStore(sqlite_path(section), clock=clock)
    if backend == "cloud":
        url = section.get("location")
        if not url or not str(url).startswith(("https://", "http://")):
            raise SetupError(
                f"the cloud memory backend needs an http(s) URL as location, got {url!r}"
            )
        # Lazy: the cloud backend is chosen by configuration and pulls in asyncio, which
        # `plan` (the sqlite backend) should not pay for.
        from kagura_agent.memory.cloud import CloudMemoryStore

        return CloudMemoryStore(
            str(url),
            token if token is not None else resolve_token(section.get("token_ref")),
            str(section.get("context_id") or DEFAULT_CONTEXT),
            clock=clock,
        )
    if backend == "postgres":
        return PgMemoryStore(postgres_url(), clock=clock)
    raise UsageError(f"unknown memory backend {backend!r} (expected sqlite, cloud or postgres)")


def postgres_url() -> str:
    """The postgres backend's database: the configured state store, which must be one."""
    location = state_location()
    if not isinstance(location, str):
        raise SetupError(
            "the postgres memory backend keeps memories in the state store, but the state"
            " store is the embedded SQLite file",
            hint="name the team's PostgreSQL in a State manifest (or set"
            f" {URL_ENV}=postgresql://…), or use backend: sqlite",
        )
    return location
