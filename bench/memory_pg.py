"""Recall latency of the PostgreSQL memory store (team mode) at 100,000 memories.

The corpus and queries are bench/recall.py's (Zipf-like words, 20% untrusted, a third of
the queries filtered by type), loaded into a fresh database of a PostgreSQL 15 started by
scripts/postgres-up.sh (or the server at KAGURA_TEST_POSTGRES_URL). Measures
``PgMemoryStore.recall`` (tsvector/GIN, ts_rank over the newest matches, common terms
left out of ranking) against a baseline in the same run: the same question answered by
reading every row (ILIKE, no index) and ranking in Python.

    python bench/memory_pg.py   # ends with: RESULT memory_pg recall_p95_ms=… n=100000 …
"""

from __future__ import annotations

import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from recall import QUERIES, SCAN_QUERIES, SEED, TYPES, _percentiles, _queries, _words

from kagura_agent.memory import Memory, Source, default_trust
from kagura_agent.memory.model import new_memory_id
from kagura_agent.memory.postgres import PgMemoryStore
from kagura_agent.state.pg import close_pools

ROOT = Path(__file__).resolve().parent.parent
# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
SIZE = 1000 if QUICK else 100_000
BATCH = 1000


def _server() -> tuple[str, Path | None]:
    given = os.environ.get("KAGURA_TEST_POSTGRES_URL")
    if given:
        return given, None
    folder = Path(tempfile.mkdtemp(prefix="kagura-pg-bench-"))
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres-up.sh"), str(folder)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1], folder


def _memories(rng: random.Random, start: int, count: int) -> list[Memory]:
    now = datetime.now(UTC).replace(microsecond=0)
    out = []
    for i in range(start, start + count):
        trusted = rng.random() >= 0.2
        source = Source("run" if trusted else "transport", f"src-{i % 500}")
        out.append(
            Memory(
                id=new_memory_id(),
                type=rng.choice(TYPES),
                summary=" ".join(_words(rng)),
                source=source,
                trust=default_trust(source),
                created=now,
                details={"step": i, "note": " ".join(_words(rng)[:4])},
                tags=(),
                task_kind=f"kind-{i % 40}",
            )
        )
    return out


def time_recall(store: PgMemoryStore, queries: list[tuple[str, str | None]]) -> list[float]:
    samples = []
    for text, kind in queries:
        started = time.perf_counter()
        store.recall(text, k=10, type=kind)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def time_scan(url: str, queries: list[tuple[str, str | None]]) -> list[float]:
    """Baseline: every row is read and matched (no index), then the best ten ranked."""
    samples = []
    with psycopg.connect(url, autocommit=True) as conn:
        for text, kind in queries:
            words = text.split()
            started = time.perf_counter()
            clauses = " OR ".join("summary ILIKE %s OR details ILIKE %s" for _ in words)
            params: list[str] = []
            for word in words:
                params += [f"%{word} %", f"%{word} %"]
            sql = f"SELECT summary FROM memory_items WHERE trust = 'trusted' AND ({clauses})"
            if kind:
                sql += " AND type = %s"
                params.append(kind)
            rows = conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
            ranked = sorted(rows, key=lambda r: -sum(w in r[0].split() for w in words))
            del ranked[10:]
            samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    rng = random.Random(SEED)
    admin, folder = _server()
    name = "bench_" + secrets.token_hex(4)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    url = urlunsplit(urlsplit(admin)._replace(path="/" + name))
    try:
        store = PgMemoryStore(url)
        started = time.perf_counter()
        for start in range(0, SIZE, BATCH):
            store.remember_many(_memories(rng, start, BATCH))
        load = time.perf_counter() - started
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")
        print(f"loaded {store.count()} memories in {load:.1f}s ({SIZE / load:.0f}/s)")
        queries = _queries(rng, QUERIES)
        time_recall(store, queries[:50])  # warm the buffers
        p50, p95 = _percentiles(time_recall(store, queries))
        print(f"100k on PostgreSQL: recall p50 {p50:.3f} ms  p95 {p95:.3f} ms")
        scan_p50, scan_p95 = _percentiles(time_scan(url, _queries(rng, SCAN_QUERIES)))
        print(f"100k: full-scan baseline p50 {scan_p50:.1f} ms  p95 {scan_p95:.1f} ms")
        store.close()
        close_pools()
        load_average = os.getloadavg()[0]  # the figures mean little on a saturated machine
        print(f"load average during the run: {load_average:.1f} on {os.cpu_count()} cores")
        print(
            f"RESULT memory_pg recall_p95_ms={p95:.3f} n={SIZE} recall_p50_ms={p50:.3f}"
            f" scan_p95_ms={scan_p95:.3f} ratio_scan_over_recall_p95={scan_p95 / p95:.1f}"
            f" load_per_s={SIZE / load:.0f} loadavg={load_average:.1f}"
        )
    finally:
        close_pools()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]
        if folder is not None:
            script = str(ROOT / "scripts" / "postgres-up.sh")
            subprocess.run(["bash", script, "--stop", str(folder)], capture_output=True)
            subprocess.run(["rm", "-rf", str(folder)], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
