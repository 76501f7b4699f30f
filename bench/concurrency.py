"""Many runs per host: N ``kagura-agent apply`` with egress started together.

    python bench/concurrency.py [--runs 20] [--rounds 1]

Each round starts N applies at the same instant on a fresh, empty state directory, each
with its own project root and its own allowlist (testing/concurrent_applies.py has the
set-up): an I/O-bound step that fetches its own host through the run's proxy a few times
with pauses, then tries the next run's host, which that run's proxy must refuse (403).
A run counts as ok when apply exits 0 and its own fetches succeeded; cross-talk is any
run whose proxy admitted a host other than its own, or did not refuse the other run's.

Wall times are from the common start to each process's exit. Memory: the peak RSS of
each apply process (with its children) and the peak of each run's proxy container
memory cgroup (``max_usage``, page cache of its tmpfs included) and its RSS, sampled
every 100 ms. ``rss_mb_per_run`` is the mean of apply peak + proxy cgroup peak. Prints:

    RESULT concurrency runs=N ok=<succeeded> crosstalk=<runs with a leak> p50_ms=… p95_ms=…
        rss_mb_per_run=… apply_rss_mb=… proxy_mb=… cores=…
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testing.concurrent_applies import daemon_cpu_ms, run_concurrent

# Where a run's time goes: the first live-view line starting with each mark.
MARKS = [
    ("plan done", '"message": "starting this run\'s egress proxy'),
    ("proxy ready", '"message": "starting container from'),
    ("first brain event", '"kind": "brain"'),
    ("brain done", '"type": "done"'),
    ("container removed", '"message": "container removed'),
    ("proxy removed", '"message": "egress proxy and networks removed'),
]


def _marks(outcomes: list[Any]) -> str:
    parts = []
    for name, mark in MARKS:
        times = [next((ms for ms, line in o.stamps if mark in line), None) for o in outcomes]
        found = [t for t in times if t is not None]
        if found:
            parts.append(f"{name} {statistics.median(found):.0f}")
    return ", ".join(parts)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2 if QUICK else 20)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    client = docker.from_env(timeout=300)
    for round_no in range(args.rounds):
        daemon_before = daemon_cpu_ms()
        with tempfile.TemporaryDirectory(prefix="kagura-bench-conc-") as tmp:
            outcomes = run_concurrent(client, Path(tmp), args.runs)
        daemon_ms = (daemon_cpu_ms() - daemon_before) / args.runs
        ok = [o for o in outcomes if o.ok]
        leaks = [o for o in outcomes if o.ok and o.crosstalk(args.runs)]
        for o in outcomes:
            if not o.ok:
                tail = "\n    ".join(o.output.strip().splitlines()[-6:])
                print(f"run {o.index}: exit {o.exit_code}, own fetches ok={o.own_ok}\n    {tail}")
            elif problems := o.crosstalk(args.runs):
                print(f"run {o.index}: CROSS-TALK {problems}")
        walls = [o.wall_ms for o in outcomes]
        apply_mb = statistics.mean(o.peak_rss_kb for o in outcomes) / 1024
        proxy_mb = statistics.mean(o.proxy_peak_kb for o in outcomes) / 1024
        proxy_rss = statistics.mean(o.proxy_rss_kb for o in outcomes) / 1024
        print(
            f"round {round_no}: walls ms min {min(walls):.0f} p50 {_pct(walls, 0.5):.0f}"
            f" p95 {_pct(walls, 0.95):.0f} max {max(walls):.0f}; apply peak RSS {apply_mb:.0f} MB"
            f" (max {max(o.peak_rss_kb for o in outcomes) / 1024:.0f}), proxy cgroup peak"
            f" {proxy_mb:.0f} MB (rss {proxy_rss:.0f} MB)"
        )
        cpu = {
            "apply": statistics.median(o.apply_cpu_ms for o in outcomes),
            "proxy": statistics.median(o.proxy_cpu_ms for o in outcomes),
            "agent": statistics.median(o.agent_cpu_ms for o in outcomes),
            "docker daemons (all users)": daemon_ms,
        }
        print("cpu ms per run: " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items()))
        print(f"median ms from the common start: {_marks(outcomes)}, exit {_pct(walls, 0.5):.0f}")
        print(
            f"RESULT concurrency runs={args.runs} ok={len(ok)} crosstalk={len(leaks)}"
            f" p50_ms={_pct(walls, 0.5):.0f} p95_ms={_pct(walls, 0.95):.0f}"
            f" rss_mb_per_run={apply_mb + proxy_mb:.0f} apply_rss_mb={apply_mb:.0f}"
            f" proxy_mb={proxy_mb:.0f} cpu_ms_per_run={sum(cpu.values()):.0f} cores={os.cpu_count()}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
