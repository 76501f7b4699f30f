"""Many runs per host: concurrent applies with egress all succeed, with no cross-talk.

Five ``kagura-agent apply`` processes start at the same instant on one fresh state
directory, each with its own project root and allowlist (testing/concurrent_applies.py).
One upstream answers every run's host name on every run's outbound network, so a refusal
can only come from the run's own proxy: each agent fetches its own host (allowed) and
then the next run's host, which its proxy must refuse with 403 — and each run's egress
decisions name only those two hosts. Afterwards nothing of any run is left in Docker.
bench/concurrency.py runs the same with 20 and reports times and memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apply_helpers import leftovers, run_ids

from testing.concurrent_applies import run_concurrent

pytestmark = pytest.mark.usefixtures("docker_client")

RUNS = 5


def test_concurrent_applies_all_succeed_without_cross_talk(
    docker_client: Any, tmp_path: Path
) -> None:
    outcomes = run_concurrent(docker_client, tmp_path, RUNS)
    for outcome in outcomes:
        tail = "\n".join(outcome.output.splitlines()[-30:])
        assert outcome.exit_code == 0, f"run {outcome.index}:\n{tail}"
        assert outcome.own_ok, f"run {outcome.index} could not fetch its own host:\n{tail}"
        assert outcome.crosstalk(RUNS) == [], f"run {outcome.index}:\n{tail}"
    ids = run_ids(tmp_path / "state")
    assert len(ids) == RUNS
    for run_id in ids:
        assert leftovers(docker_client, run_id) == []
