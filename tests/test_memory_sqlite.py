"""The embedded store: migrations, indexes, FTS query safety, crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kagura_agent.errors import SetupError
from kagura_agent.memory import Source
from kagura_agent.memory.sqlite import COMPONENT, MIGRATIONS, SqliteMemoryStore, fts_query
from kagura_agent.state import StateStore

RUN = Source("run", "r")


def test_v1_database_is_migrated_and_tags_backfilled(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    old = StateStore(path)
    old.migrate(COMPONENT, MIGRATIONS[:1])
    with old.transaction() as conn:
        conn.execute(
            "INSERT INTO memories(id, type, summary, tags, source_kind, source_id, trust, created)"
            " VALUES ('mem-old', 'note', 'written by v1', '[\"legacy\"]', 'run', 'r', 'trusted',"
            " '2025-01-01T00:00:00Z')"
        )
    old.close()
    store = SqliteMemoryStore(path)
    version = store.conn.execute(
        "SELECT version FROM schema_versions WHERE component = ?", (COMPONENT,)
    ).fetchone()[0]
    assert version == len(MIGRATIONS)
    assert [m.id for m in store.recall(tags=["legacy"])] == ["mem-old"]
    assert [m.id for m in store.recall("written")] == ["mem-old"]
    store.close()
    SqliteMemoryStore(path).close()  # reopening applies nothing twice


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    SqliteMemoryStore(path).close()
    state = StateStore(path)
    state.conn.execute("UPDATE schema_versions SET version = 99 WHERE component = ?", (COMPONENT,))
    state.close()
    with pytest.raises(SetupError, match="newer"):
        SqliteMemoryStore(path)


@pytest.mark.parametrize(
    ("kwargs", "index"),
    [
        ({"type": "failure"}, "memories_type"),
        ({"task_kind": "build", "type": "failure"}, "memories_task_kind"),
        ({"source": RUN}, "memories_source"),
        ({}, "memories_trust"),
    ],
)
def test_filtered_recall_uses_an_index(
    tmp_path: Path, kwargs: dict[str, object], index: str
) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    for i in range(50):
        store.remember(type="note", summary=f"memory {i}", source=RUN, task_kind="x")
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    store.recall(**kwargs)  # type: ignore[arg-type]
    store.conn.set_trace_callback(None)
    plan = store.conn.execute("EXPLAIN QUERY PLAN " + seen[-1].split(" LIMIT ")[0]).fetchall()
    # Parameters were inlined by the trace; the plan must name the index, not scan the table.
    text = " ".join(str(row[-1]) for row in plan)
    assert index in text, text
    store.close()


@pytest.mark.parametrize("query", ['"unbalanced', "a AND OR NOT", "col:value", "*", "NEAR(x y)"])
def test_fts_query_is_safe_for_any_text(tmp_path: Path, query: str) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    store.remember(type="note", summary="value of x and y", source=RUN)
    store.recall(query)  # must not raise an FTS syntax error
    assert fts_query("") == ""
    store.close()


_WRITER = textwrap.dedent(
    """
    import sys
    from kagura_agent.memory import Source
    from kagura_agent.memory.sqlite import SqliteMemoryStore
    store = SqliteMemoryStore(__import__("pathlib").Path(sys.argv[1]))
    i = 0
    while True:
        m = store.remember(type="note", summary="crash test memory %d " % i + "x" * 2000,
                           source=Source("run", "crash"), details={"i": i, "pad": "y" * 4000},
                           tags=["t%d" % (i % 7)])
        print(m.id, flush=True)
        i += 1
    """
)


def test_sigkill_mid_write_loses_no_committed_memory(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    committed = [proc.stdout.readline().strip() for _ in range(200)]
    os.kill(proc.pid, signal.SIGKILL)  # lands while the writer is inside another write
    proc.wait()
    committed += [line.strip() for line in proc.stdout if line.strip()]
    store = SqliteMemoryStore(path)
    assert store.integrity_check() == "ok"
    fts = store.conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('integrity-check')")
    assert fts is not None  # raises on a corrupt full-text index
    stored = {m.id for m in store.export()}
    assert set(committed) <= stored
    assert len(committed) >= 200
    store.close()


def test_recall_ranks_better_matches_first_within_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kagura_agent.memory.sqlite as sqlite_module

    store = SqliteMemoryStore(tmp_path / "m.db")
    best = store.remember(type="note", summary="flaky timeout in integration tests", source=RUN)
    for i in range(30):
        store.remember(type="note", summary=f"integration note {i}", source=RUN)
    for i in range(40):  # keeps "integration" in fewer than half, so it still ranks
        store.remember(type="note", summary=f"unrelated {i}", source=RUN)
    assert store.recall("flaky integration", k=1)[0].id == best.id
    # With a window smaller than the matches, only the newest matches are ranked.
    monkeypatch.setattr(sqlite_module, "RANK_WINDOW", 5)
    assert best.id not in {m.id for m in store.recall("flaky integration", k=5)}
    store.close()
