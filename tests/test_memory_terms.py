"""Document frequencies: kept exact in every write's transaction, and recall that leaves
out terms in more than half the memories still returns what full bm25 ranking returns."""

from __future__ import annotations

import random
from pathlib import Path

from kagura_agent.memory import Source, terms
from kagura_agent.memory.sqlite import COMPONENT, MIGRATIONS, SqliteMemoryStore
from kagura_agent.memory.terms import tokens
from kagura_agent.state import StateStore

RUN = Source("run", "r")
WORDS = [f"word{i}" for i in range(40)]


def _vocabulary(store: SqliteMemoryStore) -> dict[str, int]:
    store.conn.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, memories_fts, 'row')"
    )
    return dict(store.conn.execute("SELECT term, doc FROM temp.vocab").fetchall())


def _counted(store: SqliteMemoryStore) -> tuple[dict[str, int], int]:
    counts = dict(store.conn.execute("SELECT term, docs FROM memory_terms").fetchall())
    total = store.conn.execute("SELECT memories FROM memory_totals").fetchone()[0]
    return counts, int(total)


def test_tokens_follow_the_unicode61_tokenizer() -> None:
    assert tokens("Café_au-lait, CAFÉ 42x ñandú") == ["cafe", "au", "lait", "42x", "nandu"]
    assert tokens('"quoted" AND OR * col:value') == ["quoted", "and", "or", "col", "value"]
    assert tokens("") == []


def test_counts_match_the_fts_index_after_writes_and_forgets(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    rng = random.Random(3)
    made = []
    for i in range(120):
        text = " ".join(rng.choices([*WORDS, "Café", "naïve_Thing", "ÉCOLE"], k=6))
        made.append(
            store.remember(
                type="note", summary=text, source=RUN, details={"i": i}, tags=[f"t{i % 5}"]
            )
        )
    for memory in rng.sample(made, 50):
        store.forget(memory.id)
    counts, total = _counted(store)
    assert counts == _vocabulary(store)
    assert total == store.count() == 70
    store.close()


def test_existing_store_is_backfilled_from_the_index(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    old = SqliteMemoryStore(path)
    for i in range(30):
        old.remember(type="note", summary=f"older memory {WORDS[i % 7]}", source=RUN)
    old.close()
    state = StateStore(path)
    with state.transaction() as conn:  # back to schema v2, as written before v3 existed
        conn.execute("DROP TABLE memory_terms")
        conn.execute("DROP TABLE memory_totals")
        conn.execute("DROP INDEX memories_filter")  # v4
        conn.execute("ALTER TABLE edges DROP COLUMN details")  # v5
        conn.execute(
            "UPDATE schema_versions SET version = ? WHERE component = ?",
            (MIGRATIONS.index(terms.MIGRATION), COMPONENT),
        )
    state.close()
    store = SqliteMemoryStore(path)
    counts, total = _counted(store)
    assert counts == _vocabulary(store)
    assert total == 30
    store.close()


def _full_bm25(store: SqliteMemoryStore, query: str, k: int) -> list[str]:
    """The reference: bm25 over every query term and every match, no shortcut."""
    expression = " OR ".join(f'"{t}"' for t in tokens(query))
    rows = store.conn.execute(
        "SELECT m.id FROM memories_fts JOIN memories m ON m.rowid = memories_fts.rowid"
        " WHERE memories_fts MATCH ? ORDER BY bm25(memories_fts), m.rowid DESC LIMIT ?",
        (expression, k),
    )
    return [row[0] for row in rows]


def _terms_of(store: SqliteMemoryStore, memory_id: str) -> set[str]:
    memory = store.get(memory_id)
    assert memory is not None
    return set(tokens(memory.summary))


def test_dropping_common_terms_keeps_the_bm25_answer(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    rng = random.Random(11)
    for _ in range(300):
        # "common" is in every memory, "often" in ~70%; the rest are rare.
        words = ["common", *(["often"] if rng.random() < 0.7 else []), *rng.sample(WORDS, 3)]
        rng.shuffle(words)
        store.remember(type="note", summary=" ".join(words), source=RUN)
    for query in ["word3 common", "often word7 word8", "common often", "word39", "common"]:
        ours = [m.id for m in store.recall(query, k=10)]
        reference = _full_bm25(store, query, 10)
        assert len(ours) == len(reference) == 10
        rare = {t for t in tokens(query) if t.startswith("word")}
        if rare:
            # Every memory bm25 ranks for the rare terms comes back, in bm25's order.
            ranked = [i for i in reference if _terms_of(store, i) & rare]
            assert ranked
            assert ours[: len(ranked)] == ranked, query
        # The rest of the answer matches the query (the newest common-only matches).
        for memory_id in ours:
            assert _terms_of(store, memory_id) & set(tokens(query))
    store.close()


def test_common_terms_only_query_returns_the_newest_matches_with_filters(
    tmp_path: Path,
) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    made = [
        store.remember(type="failure" if i % 3 == 0 else "note", summary=f"common {i}", source=RUN)
        for i in range(30)
    ]
    store.remember(type="failure", summary="common but untrusted", source=Source("import", "x"))
    found = store.recall("common", k=4, type="failure")
    assert [m.id for m in found] == [m.id for m in made if m.type == "failure"][::-1][:4]
    store.close()
