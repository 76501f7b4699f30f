"""The run's journal: what its live view showed, kept in the state store (``run_events``).

Every item the live view shows — a phase, a note, each brain event (text, tool call and
result, cost, checkpoint, the end), a mid-run question, the verify results, an incident —
is also stored, in order, as the JSON ``--json`` would print, already passed through the
run's redactor. ``kagura-agent web`` reads it back as the run's timeline, while the run
goes on and after it. (Egress decisions, leases, amendments and incidents have tables of
their own; the journal does not copy them.)

A writer thread stores the items in batches (one transaction every ``FLUSH_SECONDS`` at
most), on its own connection, so the run never waits for the store; ``close`` stores
what is left. What the agent makes the host keep is bounded: at most ``EVENT_CEILING``
items a run (the rest are counted in one last ``unstored`` item), each at most
``ITEM_CHARS`` of JSON (long strings are cut, saying by how much), and consecutive text
items are joined into one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any

from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.progress import TimelineIncomplete
from kagura_agent.clock import Clock
from kagura_agent.errors import SetupError
from kagura_agent.state import Location, StateDbError, StateStore

COMPONENT = "journal"
MIGRATIONS = (
    """
    CREATE TABLE run_events (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        item TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    """,
)
EVENT_CEILING = 5_000
ITEM_CHARS = 8_192
TEXT_CHARS = 2_000  # any one string of an item
FLUSH_SECONDS = 0.25


def _now(clock: Clock) -> str:
    """The clock's time in UTC to the millisecond (the egress log's precision)."""
    return clock.now().astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def bounded(value: Any, limit: int = TEXT_CHARS) -> Any:
    """A copy of a JSON-like value whose strings are at most ``limit`` characters."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return value[:limit] + f"… ({len(value) - limit} more characters not kept)"
    if isinstance(value, dict):
        return {str(k)[:200]: bounded(v, limit) for k, v in list(value.items())[:100]}
    if isinstance(value, list | tuple):
        return [bounded(item, limit) for item in list(value)[:100]]
    return value


class Journal:
    """One run's journal writer. ``record`` never blocks on the store and never raises."""

    def __init__(self, location: Location, run_id: str, clock: Clock) -> None:
        self.run_id = run_id
        self._clock = clock
        self._location = location
        with StateStore(location) as store:
            store.migrate(COMPONENT, MIGRATIONS)
        self._pending: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._seq = 0  # the writer's: the last stored item's number
        self._accepted = 0  # items taken in (the ceiling counts these)
        self._unstored = 0
        self.problem: str | None = None  # the store refused a batch (said once, at close)
        self._thread = threading.Thread(target=self._write_loop, name="journal", daemon=True)
        self._thread.start()

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Keep one item (scrubbed by the caller) for the next batch."""
        at = _now(self._clock)
        with self._lock:
            if self._closed:
                return
            last = self._pending[-1] if self._pending else None
            if kind == "brain" and payload.get("type") == "text" and _is_text(last):
                assert last is not None
                joined = str(last[2].get("text", "")) + str(payload.get("text", ""))
                self._pending[-1] = (last[0], last[1], {**last[2], "text": joined})
                return
            if self._accepted >= EVENT_CEILING:
                self._unstored += 1
                return
            self._accepted += 1
            self._pending.append((at, kind, payload))

    def close(self) -> None:
        """Store what is left and stop the writer."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)

    def _write_loop(self) -> None:
        try:
            store = StateStore(self._location)  # a connection belongs to its thread
        except SetupError as exc:
            self.problem = str(exc)
            return
        with store:
            self._drain(store)

    def _drain(self, store: StateStore) -> None:
        while True:
            self._wake.wait(FLUSH_SECONDS)
            with self._lock:
                batch, self._pending = self._pending, []
                closing = self._closed
                if closing and self._unstored:
                    at = _now(self._clock)
                    batch.append((at, "unstored", {"count": self._unstored}))
                    self._unstored = 0
            if batch:
                self._write(store, batch)
            if closing:
                return

    def _write(self, store: StateStore, batch: list[tuple[str, str, dict[str, Any]]]) -> None:
        rows = []
        for at, kind, payload in batch:
            self._seq += 1
            text = json.dumps(bounded(payload), ensure_ascii=False, default=str)
            if len(text) > ITEM_CHARS:
                text = json.dumps({"cut": text[:ITEM_CHARS]}, ensure_ascii=False)
            rows.append((self.run_id, self._seq, at, kind, text))
        try:
            with store.transaction() as conn:
                for row in rows:
                    conn.execute(
                        "INSERT INTO run_events(run_id, seq, at, kind, item) VALUES (?, ?, ?, ?, ?)"
                        " ON CONFLICT DO NOTHING",
                        row,
                    )
        except StateDbError as exc:  # the run goes on; its timeline has a gap
            self.problem = self.problem or str(exc)


def _is_text(item: tuple[str, str, dict[str, Any]] | None) -> bool:
    return item is not None and item[1] == "brain" and item[2].get("type") == "text"


@contextmanager
def recording(live: LiveView, location: Location, run_id: str, clock: Clock) -> Iterator[Journal]:
    """``live`` keeps what it shows in the run's journal for the block; everything is
    stored when it ends (a store that refused a batch is said then, once)."""
    kept = Journal(location, run_id, clock)
    live.keep = kept.record
    try:
        yield kept
    finally:
        live.keep = None
        kept.close()
        if kept.problem:
            live.emit(TimelineIncomplete(kept.problem))
