"""Document frequencies for the embedded store's full-text recall.

FTS5's bm25 weighs a term by ``idf = log((N - n + 0.5) / (n + 0.5))`` and clamps it to
1e-6 when it is not positive, i.e. when the term occurs in more than half of the N
memories. Such a term cannot change the ranking, yet bm25 reads its whole posting list
to count n (about 1.5 ms for a word in every one of 100,000 memories). Recall therefore
looks each query term up in a document-frequency table kept here — updated in the same
transaction as every write — and ranks only by the terms that carry weight.

The tokenizer mirrors FTS5's default ``unicode61`` (letters, digits and private-use
characters form tokens; everything else separates; case folded; diacritics removed),
so the table counts what the index holds. Where the two could ever disagree on an exotic
character, the only effect is a term ranked or not ranked by bm25 — never a wrong match.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from collections.abc import Iterable, Sequence

# \w minus "_" is Unicode letters and digits: the token characters of unicode61.
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)

# v3 of the memory schema (see sqlite.MIGRATIONS). The backfill reads FTS5's own
# vocabulary, so an existing store gets exact counts without re-tokenizing anything.
MIGRATION = """
CREATE TABLE memory_terms (term TEXT PRIMARY KEY, docs INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE memory_totals (id INTEGER PRIMARY KEY CHECK (id = 1), memories INTEGER NOT NULL);
INSERT INTO memory_totals(id, memories) SELECT 1, count(*) FROM memories;
CREATE VIRTUAL TABLE temp.memory_vocab_backfill USING fts5vocab(main, memories_fts, 'row');
INSERT INTO memory_terms(term, docs) SELECT term, doc FROM temp.memory_vocab_backfill;
DROP TABLE temp.memory_vocab_backfill;
"""


def _fold(token: str) -> str:
    decomposed = unicodedata.normalize("NFD", token.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def tokens(text: str) -> list[str]:
    """The distinct index terms of ``text``, in order of first appearance."""
    return list(dict.fromkeys(t for t in map(_fold, _TOKEN.findall(text)) if t))


def document_terms(columns: Iterable[str]) -> set[str]:
    """Every distinct term of one memory's indexed columns (summary, details, tags)."""
    found: set[str] = set()
    for text in columns:
        found.update(tokens(text))
    return found


def count_added(conn: sqlite3.Connection, terms: set[str]) -> None:
    """A memory with ``terms`` was inserted (call inside the write's transaction)."""
    conn.executemany(
        "INSERT INTO memory_terms(term, docs) VALUES (?, 1)"
        " ON CONFLICT(term) DO UPDATE SET docs = docs + 1",
        [(term,) for term in terms],
    )
    conn.execute("UPDATE memory_totals SET memories = memories + 1 WHERE id = 1")


def count_removed(conn: sqlite3.Connection, terms: set[str]) -> None:
    """A memory with ``terms`` was deleted (call inside the delete's transaction)."""
    rows = [(term,) for term in terms]
    conn.executemany("UPDATE memory_terms SET docs = docs - 1 WHERE term = ?", rows)
    conn.executemany("DELETE FROM memory_terms WHERE term = ? AND docs <= 0", rows)
    conn.execute("UPDATE memory_totals SET memories = max(memories - 1, 0) WHERE id = 1")


def split_by_weight(
    conn: sqlite3.Connection, query_terms: Sequence[str]
) -> tuple[list[str], list[str]]:
    """``(weighted, common)``: terms in at most half the memories, and the rest.

    Terms no memory contains count as weighted (they simply match nothing).
    """
    if not query_terms:
        return [], []
    row = conn.execute("SELECT memories FROM memory_totals WHERE id = 1").fetchone()
    total = int(row[0]) if row else 0
    marks = ",".join("?" * len(query_terms))
    docs = dict(
        conn.execute(
            f"SELECT term, docs FROM memory_terms WHERE term IN ({marks})", list(query_terms)
        ).fetchall()
    )
    weighted = [t for t in query_terms if 2 * int(docs.get(t, 0)) <= total]
    common = [t for t in query_terms if 2 * int(docs.get(t, 0)) > total]
    return weighted, common


def match_expression(query_terms: Sequence[str]) -> str:
    """An FTS5 MATCH expression where any of the (quoted, hence literal) terms may match."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in query_terms)
