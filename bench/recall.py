"""Recall latency of the embedded memory store at 10,000 and 100,000 memories.

Measures ``SqliteMemoryStore.recall`` (FTS5, bm25, trusted-only default, sometimes a
type filter) against a full-scan baseline in the same run: a LIKE over every row
followed by ranking in Python, which is what a store without an index must do.
Target: p95 < 5 ms at 100,000 memories. Query words follow the text's Zipf-like
distribution, so many are in most memories; recall ranks by the others (memory/terms.py).

    python bench/recall.py        # ends with: RESULT recall p50_10k_ms=… …
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from kagura_agent.memory import Source
from kagura_agent.memory.sqlite import SqliteMemoryStore

# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"

SEED = 7
VOCABULARY = 4000
QUERIES = 60 if QUICK else 400
SCAN_QUERIES = 4 if QUICK else 40
TYPES = ("note", "failure", "fix", "run-cost", "context", "output")


def _words(rng: random.Random) -> list[str]:
    # Zipf-like: low word numbers are common, as in real text.
    return [f"w{int(rng.paretovariate(1.1)) % VOCABULARY}" for _ in range(6)] + [
        f"w{rng.randrange(VOCABULARY)}" for _ in range(4)
    ]


def fill(store: SqliteMemoryStore, count: int, rng: random.Random) -> None:
    """Add ``count`` memories (20% untrusted), committing each as the store does."""
    for i in range(count):
        trusted = rng.random() >= 0.2
        store.remember(
            type=rng.choice(TYPES),
            summary=" ".join(_words(rng)),
            source=Source("run" if trusted else "transport", f"src-{i % 500}"),
            details={"step": i, "note": " ".join(_words(rng)[:4])},
            task_kind=f"kind-{i % 40}",
        )


def _queries(rng: random.Random, count: int) -> list[tuple[str, str | None]]:
    out = []
    for _ in range(count):
        # Query words follow the text's own distribution, so common words are asked too.
        words = " ".join(rng.sample(_words(rng), rng.choice((1, 2))))
        out.append((words, rng.choice((None, None, "failure"))))
    return out


def _percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[94]


def time_recall(store: SqliteMemoryStore, queries: list[tuple[str, str | None]]) -> list[float]:
    samples = []
    for text, kind in queries:
        started = time.perf_counter()
        store.recall(text, k=10, type=kind)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def time_scan(store: SqliteMemoryStore, queries: list[tuple[str, str | None]]) -> list[float]:
    """Baseline: every row is read and matched, then the best ten are ranked."""
    samples = []
    for text, kind in queries:
        words = text.split()
        started = time.perf_counter()
        clauses = " OR ".join("summary LIKE ? OR details LIKE ?" for _ in words)
        params: list[str] = []
        for word in words:
            params += [f"%{word} %", f"%{word} %"]
        sql = f"SELECT * FROM memories NOT INDEXED WHERE trust = 'trusted' AND ({clauses})"
        if kind:
            sql += " AND type = ?"
            params.append(kind)
        rows = store.conn.execute(sql, params).fetchall()
        ranked = sorted(rows, key=lambda r: -sum(w in r["summary"].split() for w in words))
        del ranked[10:]  # the answer: the best ten
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteMemoryStore(Path(tmp) / "memory.db")
        # Loading only: skip fsync per commit so setup stays short; recall is unaffected.
        store.conn.execute("PRAGMA synchronous=OFF")
        results: dict[str, float] = {}
        sizes = ((100, "10k"), (1000, "100k")) if QUICK else ((10_000, "10k"), (100_000, "100k"))
        for size, label in sizes:
            started = time.perf_counter()
            fill(store, size - store.count(), rng)
            store.conn.execute("PRAGMA optimize")
            print(f"loaded {store.count()} memories in {time.perf_counter() - started:.1f}s")
            queries = _queries(rng, QUERIES)
            time_recall(store, queries[:50])  # warm the page cache
            p50, p95 = _percentiles(time_recall(store, queries))
            results[f"p50_{label}_ms"], results[f"p95_{label}_ms"] = p50, p95
            print(f"{label}: recall p50 {p50:.3f} ms  p95 {p95:.3f} ms")
        scan_p50, scan_p95 = _percentiles(time_scan(store, _queries(rng, SCAN_QUERIES)))
        print(f"100k: full-scan baseline p50 {scan_p50:.1f} ms  p95 {scan_p95:.1f} ms")
        print(f"speed-up at 100k (scan p95 / recall p95): {scan_p95 / results['p95_100k_ms']:.0f}x")
        print(f"target p95 < 5 ms at 100k: {'met' if results['p95_100k_ms'] < 5 else 'MISSED'}")
        store.close()
    print(
        "RESULT recall "
        + " ".join(f"{key}={value:.3f}" for key, value in results.items())
        + f" scan_p95_100k_ms={scan_p95:.3f} ratio_scan_over_recall_p95_100k="
        f"{scan_p95 / results['p95_100k_ms']:.1f}"
    )


if __name__ == "__main__":
    main()
