"""How fast the web console's pages load with many runs in the state store.

Seeds a fresh state store with the demo runs (testing/web_scene: apply's real sequence,
the proxy log writer, the graduation ledger), then copies those runs' rows — every column
as apply wrote it — until the store holds 10,000 runs over 20 task kinds and 4 runners
(one run of them carrying the demo's journal and egress decisions). Starts
``kagura-agent web --port 0``, logs in with the URL it printed, and times each page over
HTTP (the server renders the whole page; what a browser waits for before it paints):
the runs list (plain, filtered by kind, by outcome, and a page 100 pages deep), a run's
timeline, its live part, costs, graduation, approvals and incidents. The baseline is
measured in the same run and the same server: a static file (the stylesheet), which goes
through the same login check and headers but reads no store.

Then the store grows to 100,000 runs and the pages are timed again: a page still holds
at most 50 runs (keyset pagination), whatever the store holds.

    python bench/web.py            # ends: RESULT web p95_ms=… runs=10000 static_p95_ms=… ratio=…
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
ROUNDS = 1 if QUICK else int(os.environ.get("BENCH_ROUNDS", "20"))
SMALL, LARGE, DEEP = (200, 400, 2) if QUICK else (10_000, 100_000, 100)
KINDS, RUNNERS = 20, 4


def seed(base: Path, env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "testing.web_scene", str(base)],
        cwd=REPO,
        # The scene applies against the in-memory runtime: no Docker (its plans see no
        # image facts, the same on every machine).
        env={**env, "DOCKER_HOST": "unix:///nonexistent/kagura-bench-no-docker.sock"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"seeding failed: {done.stderr[-2000:]}")
    runs: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return runs


def grow(db: Path, total: int) -> None:
    """Copy the store's real runs rows until it holds ``total`` runs: new ids, start
    times a minute apart going back, kinds, runners and outcomes spread out."""
    with sqlite3.connect(db) as conn:
        have = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
        varied = {
            "run_id": "printf('run-b%010d', n)",
            "started_at": "strftime('%Y-%m-%dT%H:%M:%SZ', '2026-06-01', printf('-%d minutes', n))",
            "ended_at": "strftime('%Y-%m-%dT%H:%M:%SZ', '2026-06-01', printf('-%d minutes', n),"
            " '+40 seconds')",
            "kind": f"printf('kind-%02d', n % {KINDS})",
            "host": f"printf('runner-%d', n % {RUNNERS})",
            "outcome": "CASE WHEN n % 17 = 0 THEN 'failed' ELSE 'success' END",
            "exit_code": "CASE WHEN n % 17 = 0 THEN 1 ELSE 0 END",
            "turns": "3 + n % 7",
            "cost_usd": "0.02 + (n % 13) / 100.0",
        }
        select = ", ".join(varied.get(c, c) for c in columns)
        conn.execute(
            f"WITH RECURSIVE seq(n) AS (SELECT {have} UNION ALL SELECT n + 1 FROM seq"
            f" WHERE n + 1 < {total}) INSERT INTO runs ({', '.join(columns)})"
            f" SELECT {select} FROM seq, (SELECT * FROM runs WHERE outcome = 'success'"
            " ORDER BY started_at LIMIT 1) template"
        )
        conn.commit()


class Console:
    def __init__(self, env: dict[str, str], manifests: Path) -> None:
        argv = [sys.executable, "-m", "kagura_agent", "web", "--port", "0"]
        self.process = subprocess.Popen(
            [*argv, "--manifests", str(manifests)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        url = self.process.stdout.readline().strip()
        if "/login?token=" not in url:
            self.close()
            raise SystemExit(f"the console printed no login URL: {url!r}")
        self.base = url.split("/login", 1)[0]
        jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with self.opener.open(url) as response:  # the one-time token becomes the cookie
            response.read()

    def get(self, path: str) -> tuple[float, bytes]:
        started = time.perf_counter()
        with self.opener.open(self.base + path) as response:
            body: bytes = response.read()
        return (time.perf_counter() - started) * 1000, body

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=15)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def timed(console: Console, paths: list[str]) -> tuple[list[float], dict[str, float]]:
    every: list[float] = []
    per_page: dict[str, list[float]] = {path: [] for path in paths}
    for path in paths:  # warm each page once (templates compiled, files cached)
        console.get(path)
    for _ in range(ROUNDS):
        for path in paths:
            ms, _ = console.get(path)
            every.append(ms)
            per_page[path].append(ms)
    return every, {path: statistics.median(times) for path, times in per_page.items()}


def deep_cursor(console: Console, pages: int) -> str:
    """The query string of the runs list ``pages`` pages deep (following 'older')."""
    query = ""
    for _ in range(pages):
        _, body = console.get("/" + query)
        found = re.search(rb'href="(\?[^"]*before=[^"]*)" rel="next"', body)
        if found is None:
            break
        query = found.group(1).decode().replace("&amp;", "&")
    return query


def rows_on(console: Console, path: str) -> int:
    _, body = console.get(path)
    return body.count(b'<a href="/runs/run-')


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kagura-bench-web-") as tmp:
        base = Path(tmp)
        env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(base / "state"), "NO_COLOR": "1"}
        runs = seed(base, env)
        db = base / "state" / "state.db"
        grow(db, SMALL)
        run_id = runs["docs-4"]
        console = Console(env, base / "manifests")
        try:
            deep = deep_cursor(console, DEEP)
            pages = [
                "/",
                "/?kind=kind-07",
                "/?outcome=failed",
                "/" + deep,
                f"/runs/{run_id}",
                f"/runs/{run_id}/live",
                "/costs",
                "/costs?kind=kind-03",
                "/graduation",
                "/approvals",
                "/incidents",
            ]
            static, _ = timed(console, ["/static/console.css"])
            every, medians = timed(console, pages)
            rows_10k = rows_on(console, "/")
        finally:
            console.close()
        for path, ms in medians.items():
            print(f"  10k  median {ms:7.1f} ms  {path[:60]}")
        grow(db, LARGE)
        console = Console(env, base / "manifests")
        try:
            every_100k, medians_100k = timed(console, ["/", "/?kind=kind-07", "/" + deep,
                                                       "/costs", f"/runs/{run_id}"])  # fmt: skip
            rows_100k = rows_on(console, "/")
            rows_deep = rows_on(console, "/" + deep)
        finally:
            console.close()
        for path, ms in medians_100k.items():
            print(f"  100k median {ms:7.1f} ms  {path[:60]}")
    web, baseline = p95(every), p95(static)
    print(
        f"RESULT web p95_ms={web:.1f} runs={SMALL} static_p95_ms={baseline:.1f}"
        f" ratio={web / baseline:.1f} p95_100k_ms={p95(every_100k):.1f}"
        f" rows_per_page_10k={rows_10k} rows_per_page_100k={rows_100k}"
        f" rows_page_100_deep={rows_deep} target_ms=300"
    )


if __name__ == "__main__":
    main()
