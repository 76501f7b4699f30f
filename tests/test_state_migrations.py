"""Schema migrations never race: 20 processes started together on an empty state directory
all migrate every component (state store and memory store) and all succeed, every round.

Before the version was read inside the migration's write transaction, a fresh directory
gave "table memories already exists", "table lease_grants already exists" and
"table graduation_meta already exists" when runs started together.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.state import URL_ENV, Location, SchemaBehind, StateDbError, StateStore
from testing import forked

PROCESSES = 20
ROUNDS = 3

# Each process (forked, testing/forked.py: its own pid, connections and files) imports
# what the commands import, says it is ready, and waits at the barrier: its standard input
# is one pipe all of them read, closed by the test once all are ready, so they return
# together. Then it opens every component's tables the way the commands do and prints the
# versions it saw.
CHILD = """
import socket, sys
from kagura_agent.state import URL_ENV, Location, SchemaBehind, StateDbError, StateStore, open_store
from kagura_agent.apply.records import runs
from kagura_agent.approvals import log
from kagura_agent.clock import SystemClock
from kagura_agent.graduation import ledger as graduation
from kagura_agent.membrane.egress import audit
from kagura_agent.membrane.leases.ledger import Ledger
from kagura_agent.memory.sqlite import SqliteMemoryStore
from kagura_agent.patterns import checkpoint
from kagura_agent.paths import state_dir
from kagura_agent.plan import history
from kagura_agent.cockpit import registry
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ready:
    ready.sendto(b".", sys.argv[1])
sys.stdin.buffer.read()  # the barrier: end of file when the test closes the pipe
store = open_store()
memory = SqliteMemoryStore(state_dir() / "memory.db")
graduation.migrate(store)
log.migrate(store)
Ledger(store, SystemClock())
audit.open_store(store)
store.migrate("runs", runs.MIGRATIONS)
store.migrate("plans", history.MIGRATIONS)
store.migrate("cockpit", registry.MIGRATIONS)
store.migrate(checkpoint.COMPONENT, checkpoint.MIGRATIONS)
rows = store.conn.execute("SELECT component, version FROM schema_versions ORDER BY 1")
print(sorted((r[0], r[1]) for r in rows))
"""


def _round(state: Path, url: str | None = None) -> list[forked.Forked]:
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state)}
    env.pop(URL_ENV, None)
    if url is not None:
        env[URL_ENV] = url
    address = str(state.parent / f"{state.name}.ready")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ready:
        ready.bind(address)
        ready.settimeout(120)
        barrier, release = os.pipe()
        try:
            children = [
                forked.spawn([address], cwd=state.parent, env=env, stdin=barrier, code=CHILD)
                for _ in range(PROCESSES)
            ]
            for _ in children:
                ready.recv(1)
        finally:
            os.close(barrier)
            os.close(release)  # every child's read returns now
    return [child.wait(timeout=120) for child in children]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_twenty_processes_migrate_a_fresh_state_directory_together(
    tmp_path: Path, round_: int
) -> None:
    state = tmp_path / f"state-{round_}"  # does not exist yet: every process creates it
    results = _round(state)
    failed = [r for r in results if r.returncode != 0]
    assert failed == [], failed[0].stderr.decode()
    seen = {r.stdout for r in results}
    assert len(seen) == 1, seen  # every process saw the same, complete schema
    with StateStore(state / "state.db") as store:
        versions = dict(store.conn.execute("SELECT component, version FROM schema_versions"))
    assert versions["graduation"] >= 1 and versions["leases"] >= 1 and versions["runs"] >= 1
    with StateStore(state / "memory.db") as store:
        versions = dict(store.conn.execute("SELECT component, version FROM schema_versions"))
    assert versions["memory"] >= 1


def test_twenty_processes_migrate_a_fresh_postgres_database_together(
    tmp_path: Path, postgres_server: Any
) -> None:
    """The same on PostgreSQL: the version is read under the advisory write lock, inside
    the transaction that applies the steps (and creates schema_versions)."""
    with postgres_server.fresh_database() as url:
        results = _round(tmp_path / "state", url)
        failed = [r for r in results if r.returncode != 0]
        assert failed == [], failed[0].stderr.decode()
        assert len({r.stdout for r in results}) == 1
        with StateStore(url) as store:
            versions = dict(store.conn.execute("SELECT component, version FROM schema_versions"))
        assert versions["graduation"] >= 1 and versions["leases"] >= 1 and versions["runs"] >= 1
        assert not (tmp_path / "state" / "state.db").exists()  # nothing went to SQLite


def _tables(store: StateStore) -> set[str]:
    if store.dialect == "sqlite":
        sql = "SELECT name FROM sqlite_master WHERE type='table'"
    else:
        sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    return {row[0] for row in store.conn.execute(sql)}


def test_pending_steps_apply_in_one_transaction(state_target: Location) -> None:
    """A reader sees a component before or after its migration, never half-way: a later
    step that fails leaves no earlier step behind (before, steps committed one by one)."""
    steps = [
        "CREATE TABLE one (x INTEGER);",
        "CREATE TABLE two (x INTEGER);",
        "CREATE TABLE three (x INTEGER, x INTEGER);",  # duplicate column: fails
    ]
    with StateStore(state_target) as store:
        with pytest.raises(StateDbError, match=r"specified more than once|duplicate column"):
            store.migrate("atomic", steps)
        assert store._version("atomic") == 0
        assert not {"one", "two"} & _tables(store)
        store.migrate("atomic", steps[:2])
        assert store._version("atomic") == 2
        assert {"one", "two"} <= _tables(store)


def test_a_read_only_store_never_migrates(state_target: Location) -> None:
    """Read-only (plan): a component not at this version raises SchemaBehind and nothing
    is created; after a writer migrates, the reader reads it."""
    from kagura_agent.plan import history

    with StateStore(state_target) as writer:
        writer.migrate("unrelated", ["CREATE TABLE unrelated (x INTEGER);"])
    reader = StateStore.read_only(state_target)
    assert reader is not None
    with reader, pytest.raises(SchemaBehind):
        reader.migrate("plans", history.MIGRATIONS)
    with StateStore(state_target) as writer:
        writer.migrate("plans", history.MIGRATIONS)
    reader = StateStore.read_only(state_target)
    assert reader is not None
    with reader:
        reader.migrate("plans", history.MIGRATIONS)  # current: nothing to do
        with pytest.raises(StateDbError), reader.transaction() as conn:
            conn.execute("DELETE FROM applied_plans")
