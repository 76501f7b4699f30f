"""Every benchmark in bench/ still runs: once, in its quick mode (KAGURA_BENCH_QUICK=1: one
iteration at small sizes), as ``python bench/NAME.py`` from outside the checkout, ending
with its one ``RESULT NAME key=value …`` line. The numbers are not checked (a timed test
is no test); that the bench runs and says what it measured is.

Each bench is listed once, by what it needs; a new file in bench/ that is in no list fails
``test_every_bench_is_run``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Benches that need nothing running (a few seconds each in quick mode).
PLAIN = ["graduation_snapshot", "leases", "recall", "setid_walk", "web"]
# Benches that start containers (images built: CI's setup builds them), or read image
# facts from Docker (plan_latency: plan gathers them).
DOCKER = [
    "apply_overhead",
    "cockpit_status",
    "concurrency",
    "cost_forecast",
    "disk_budget",
    "egress_throughput",
    "endpoint_sigv4",
    "launch_overhead",
    "model_calls",
    "plan_latency",
]
# Benches on PostgreSQL (memory_pg uses the tests' server), and on both (team_scale's
# runners apply in containers; it starts its own PostgreSQL).
POSTGRES = ["memory_pg"]
DOCKER_POSTGRES = ["team_scale"]
RESULT = re.compile(r"RESULT (?P<name>[a-z0-9_]+)((?: [a-z0-9_]+=[^\s=]+)+)")


def _check(name: str, last: str) -> None:
    shape = RESULT.fullmatch(last)
    assert shape is not None, f"last line is not RESULT NAME key=value ...: {last!r}"
    assert shape["name"] == name, last


def test_every_bench_is_run() -> None:
    found = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
    assert found == sorted(PLAIN + DOCKER + POSTGRES + DOCKER_POSTGRES)


@pytest.mark.parametrize("name", PLAIN)
def test_a_bench_runs(name: str, bench_run: Callable[..., str]) -> None:
    _check(name, bench_run(name))


@pytest.mark.parametrize("name", DOCKER)
def test_a_docker_bench_runs(name: str, bench_run: Callable[..., str], docker_client: Any) -> None:
    _check(name, bench_run(name))


@pytest.mark.parametrize("name", POSTGRES)
def test_a_postgres_bench_runs(
    name: str, bench_run: Callable[..., str], postgres_server: Any
) -> None:
    _check(name, bench_run(name, KAGURA_TEST_POSTGRES_URL=postgres_server.url))


@pytest.mark.parametrize("name", DOCKER_POSTGRES)
def test_a_docker_and_postgres_bench_runs(
    name: str, bench_run: Callable[..., str], docker_client: Any, postgres_server: Any
) -> None:
    _check(name, bench_run(name))
