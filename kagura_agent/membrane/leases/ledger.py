"""The durable lease ledger: one row per minted credential, in the state store.

Crash safety comes from the order of writes, each its own committed transaction:

    intent  (written BEFORE the provider is called: what, for whom, owner process)
      → live     (minted id + expiry recorded right after the mint returns)
      → released | lapsing | revoked | expired | failed   (closed)
    refused  (a request default-deny turned away; closed on arrival, kept as a record)
    poison   (revoking failed for a reason retrying cannot fix; open until an operator acts)

Each row keeps how its credential ends (``release``, from the provider type's traits,
membrane/providers/traits.py): ``revoked`` at release, ``revoked-live`` (revoked at
release, lapses after a crash), ``lapses`` (never revocable: STS session credentials work
until their expiry) or ``standing`` (a static secret, never minted). A credential release
could not revoke is closed ``lapsing``, not ``released``: ``leases list`` keeps showing it
until its expiry, because it still works.

A crash between any two steps leaves an open row naming its owner (pid + process start
time + run id); the sweeper revokes what the dead owner left. No value is ever stored.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kagura_agent.clock import Clock, iso, parse_iso
from kagura_agent.membrane.providers.traits import release_says, traits_of
from kagura_agent.processes import process_start, this_host
from kagura_agent.state import Connection, StateStore

COMPONENT = "leases"
MIGRATIONS = [
    """
    CREATE TABLE lease_grants (
        id TEXT PRIMARY KEY,
        lease TEXT NOT NULL,
        name TEXT NOT NULL,
        provider TEXT NOT NULL,
        type TEXT NOT NULL,
        scope TEXT NOT NULL,
        scope_spec TEXT NOT NULL,
        secret_ref TEXT NOT NULL,
        class TEXT NOT NULL,
        ttl_seconds INTEGER NOT NULL,
        state TEXT NOT NULL,
        minted_id TEXT,
        expires_at TEXT,
        created_at TEXT NOT NULL,
        closed_at TEXT,
        run_id TEXT,
        owner_pid INTEGER,
        owner_start TEXT,
        heartbeat_at TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at TEXT,
        last_error TEXT,
        note TEXT
    );
    CREATE INDEX lease_grants_open ON lease_grants(state) WHERE closed_at IS NULL;
    """,
    # The owner's host: on a state store shared by several hosts, a pid means something
    # only on the host that recorded it.
    "ALTER TABLE lease_grants ADD COLUMN owner_host TEXT",
    # How the credential ends (traits.Release), as it was when the row was written.
    "ALTER TABLE lease_grants ADD COLUMN release_kind TEXT",
]

OPEN_STATES = ("intent", "live", "poison")


@dataclass(frozen=True)
class Owner:
    """The process holding a lease: pid plus its start time, so pid reuse is noticed,
    and the host it runs on, so another host's pid is never judged here."""

    pid: int
    start: str | None
    run_id: str
    host: str | None = None

    @classmethod
    def current(cls, run_id: str) -> Owner:
        return cls(os.getpid(), process_start(os.getpid()), run_id, this_host())


@dataclass(frozen=True)
class GrantRow:
    """One ledger row, as read back. Carries references and ids only, never values."""

    id: str
    lease: str
    name: str
    provider: str
    type: str
    scope: str
    scope_spec: Mapping[str, Any]
    secret_ref: str
    klass: str
    ttl_seconds: int
    state: str
    minted_id: str | None
    expires_at: datetime | None
    created_at: datetime
    closed_at: datetime | None
    run_id: str | None
    owner_pid: int | None
    owner_start: str | None
    heartbeat_at: datetime | None
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    note: str | None
    owner_host: str | None = None
    release_kind: str | None = None  # as recorded; rows from before: None

    @property
    def open(self) -> bool:
        return self.closed_at is None

    @property
    def release(self) -> str:
        """How this credential ends: the recorded kind, else its type's (``unknown`` for a
        type this version does not know)."""
        if self.release_kind:
            return self.release_kind
        traits = traits_of(self.type)
        return traits.release if traits is not None else "unknown"

    @property
    def ends(self) -> str:
        """How it ends, in words (``leases list``)."""
        return release_says(self.release, iso(self.expires_at) if self.expires_at else "its expiry")

    def to_json(self) -> dict[str, Any]:
        def when(moment: datetime | None) -> str | None:
            return iso(moment) if moment else None

        return {
            "id": self.id,
            "lease": self.lease,
            "name": self.name,
            "provider": self.provider,
            "type": self.type,
            "scope": self.scope,
            "class": self.klass,
            "ttl_seconds": self.ttl_seconds,
            "state": self.state,
            "minted_id": self.minted_id,
            "expires_at": when(self.expires_at),
            "created_at": when(self.created_at),
            "closed_at": when(self.closed_at),
            "run_id": self.run_id,
            "owner_pid": self.owner_pid,
            "owner_host": self.owner_host,
            "heartbeat_at": when(self.heartbeat_at),
            "attempts": self.attempts,
            "next_attempt_at": when(self.next_attempt_at),
            "last_error": self.last_error,
            "note": self.note,
            "release": self.release,
            "revocable": self.release in ("revoked", "revoked-live"),
            "ends": self.ends,
        }


def _row(raw: Any) -> GrantRow:
    def when(text: str | None) -> datetime | None:
        return parse_iso(text) if text else None

    return GrantRow(
        id=raw["id"],
        lease=raw["lease"],
        name=raw["name"],
        provider=raw["provider"],
        type=raw["type"],
        scope=raw["scope"],
        scope_spec=json.loads(raw["scope_spec"]),
        secret_ref=raw["secret_ref"],
        klass=raw["class"],
        ttl_seconds=int(raw["ttl_seconds"]),
        state=raw["state"],
        minted_id=raw["minted_id"],
        expires_at=when(raw["expires_at"]),
        created_at=parse_iso(raw["created_at"]),
        closed_at=when(raw["closed_at"]),
        run_id=raw["run_id"],
        owner_pid=raw["owner_pid"],
        owner_start=raw["owner_start"],
        heartbeat_at=when(raw["heartbeat_at"]),
        attempts=int(raw["attempts"]),
        next_attempt_at=when(raw["next_attempt_at"]),
        last_error=raw["last_error"],
        note=raw["note"],
        owner_host=raw["owner_host"],
        release_kind=raw["release_kind"],
    )


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


class Ledger:
    """Reads and writes lease_grants; every write is one committed transaction.

    The ledger keeps its own connection to the state database, usable from any thread
    (the lease keeper renews off the event loop), serialised by a lock.
    """

    def __init__(self, store: StateStore, clock: Clock) -> None:
        store.migrate(COMPONENT, MIGRATIONS)
        self.clock = clock
        self._lock = threading.RLock()
        self._conn = store.connect()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._lock, self._conn.transaction() as conn:
            yield conn

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def disconnect(self) -> None:
        """Close the ledger's own connection (the StateStore keeps its own)."""
        with self._lock:
            self._conn.close()

    def record_intent(
        self,
        *,
        lease: str,
        request: Mapping[str, Any],
        ttl_seconds: int,
        owner: Owner,
        state: str = "intent",
        note: str | None = None,
    ) -> str:
        """Write the row before anything is minted (or a closed ``refused`` record)."""
        grant = new_id("g-")
        now = iso(self.clock.now())
        closed = now if state not in OPEN_STATES else None
        traits = traits_of(str(request["type"]))
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO lease_grants(id, lease, name, provider, type, scope, scope_spec,"
                " secret_ref, class, ttl_seconds, state, created_at, closed_at, run_id,"
                " owner_pid, owner_start, heartbeat_at, note, owner_host, release_kind)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    grant,
                    lease,
                    str(request["name"]),
                    str(request["provider"]),
                    str(request["type"]),
                    str(request["scope"]),
                    json.dumps(request.get("scope_spec") or {}, sort_keys=True),
                    str(request["secret_ref"]),
                    str(request["class"]),
                    ttl_seconds,
                    state,
                    now,
                    closed,
                    owner.run_id,
                    owner.pid,
                    owner.start,
                    now,
                    note,
                    owner.host,
                    traits.release if traits is not None else None,
                ),
            )
        return grant

    def record_minted(self, grant: str, minted_id: str, expires_at: datetime) -> None:
        self._update(grant, state="live", minted_id=minted_id, expires_at=iso(expires_at))

    def close(self, grant: str, state: str, note: str | None = None) -> None:
        now = iso(self.clock.now())
        self._update(grant, state=state, closed_at=now, note=note, next_attempt_at=None)

    def record_failure(
        self, grant: str, error: str, *, poison: bool, next_attempt_at: datetime | None
    ) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE lease_grants SET attempts = attempts + 1, last_error = ?,"
                " next_attempt_at = ?, state = CASE WHEN ? THEN 'poison' ELSE state END"
                " WHERE id = ?",
                (error, iso(next_attempt_at) if next_attempt_at else None, poison, grant),
            )

    def heartbeat(self, lease: str) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE lease_grants SET heartbeat_at = ? WHERE lease = ? AND closed_at IS NULL",
                (iso(self.clock.now()), lease),
            )

    def get(self, grant: str) -> GrantRow | None:
        found = self._query("SELECT * FROM lease_grants WHERE id = ?", (grant,))
        return _row(found[0]) if found else None

    def open_rows(self) -> list[GrantRow]:
        rows = self._query(
            "SELECT * FROM lease_grants WHERE closed_at IS NULL ORDER BY created_at, id"
        )
        return [_row(r) for r in rows]

    def rows(self, *, include_closed: bool = True, limit: int = 200) -> list[GrantRow]:
        """The newest rows; without ``include_closed``, the open ones and the closed ones
        whose credential still works (``lapsing`` before its expiry)."""
        if include_closed:
            rows = self._query(
                "SELECT * FROM lease_grants ORDER BY created_at DESC, id LIMIT ?", (limit,)
            )
        else:
            rows = self._query(
                "SELECT * FROM lease_grants WHERE closed_at IS NULL"
                " OR (state = 'lapsing' AND expires_at > ?)"
                " ORDER BY created_at DESC, id LIMIT ?",
                (iso(self.clock.now()), limit),
            )
        return [_row(r) for r in rows]

    def _update(self, grant: str, **fields: Any) -> None:
        columns = ", ".join(f"{name} = ?" for name in fields)
        with self._transaction() as conn:
            conn.execute(
                f"UPDATE lease_grants SET {columns} WHERE id = ?", (*fields.values(), grant)
            )
