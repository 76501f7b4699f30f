"""How long the planner's graduation Fact costs as evidence piles up.

Fills a fresh state store with N verified runs spread over C categories (an occasional
failure demotes a category, as in real use), then times
``snapshot()`` (one aggregate query) against a baseline measured in the same run: reading
every evidence row into Python and tallying there, which is what an unindexed, in-memory
design would do on each plan.

    python bench/graduation_snapshot.py [N]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kagura_agent.clock import FixedClock, iso
from kagura_agent.graduation import Knobs, migrate, snapshot
from kagura_agent.state import StateStore

CATEGORIES = 20


def fill(store: StateStore, runs: int) -> None:
    migrate(store)
    clock = FixedClock(datetime(2025, 1, 1, tzinfo=UTC))
    rows = []
    for run in range(runs):
        clock.advance(timedelta(minutes=7))
        outcome = "failure" if run % 97 == 0 else "success"
        rows.append(
            (
                f"cat-{run % CATEGORIES}",
                f"run-{run}",
                f"task-{run % 11}",
                "sha256:x",
                iso(clock.now()),
                outcome,
                "[]",
            )
        )
    with store.sqlite_transaction() as conn:  # the driver's executemany: one statement
        conn.executemany(
            "INSERT INTO graduation_evidence (category, run_id, task, fingerprint,"
            " recorded_at, outcome, verify) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        # A failure demotes its category: its count restarts after the failure's row.
        conn.execute(
            "INSERT INTO graduation_categories (category, state, reset_seq)"
            " SELECT category, 'locked', COALESCE(MAX(CASE WHEN outcome = 'failure'"
            " THEN id END), 0) FROM graduation_evidence GROUP BY category"
        )


def python_tally(store: StateStore) -> dict[str, int]:
    """The baseline: every row into Python, counted since each category's reset."""
    resets = {
        row["category"]: row["reset_seq"]
        for row in store.conn.execute("SELECT * FROM graduation_categories")
    }
    counts: dict[str, int] = defaultdict(int)
    for row in store.conn.execute("SELECT * FROM graduation_evidence"):
        if row["outcome"] == "success" and row["id"] > resets.get(row["category"], 0):
            counts[row["category"]] += 1
    return counts


# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"


def best_of(fn: object, repeat: int = 1 if QUICK else 7) -> float:
    assert callable(fn)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else (100 if QUICK else 50_000)
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp) / "state.db")
        fill(store, runs)
        ours = best_of(lambda: snapshot(store, Knobs()))
        base = best_of(lambda: python_tally(store))
        store.close()
    print(f"evidence rows {runs}: snapshot {ours * 1000:.1f} ms, python tally {base * 1000:.1f} ms")
    print(
        f"RESULT graduation_snapshot rows={runs} snapshot_ms={ours * 1000:.2f}"
        f" python_tally_ms={base * 1000:.2f} ratio={base / ours:.2f}"
    )


if __name__ == "__main__":
    main()
