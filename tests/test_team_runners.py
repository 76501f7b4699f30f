"""The team queue end to end: real PostgreSQL (scripts/postgres-up.sh), procrastinate,
``kagura-agent runner`` processes each with its own identity and state directory, real
Docker containers."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, run_ids
from team_helpers import (  # noqa: F401 - fixtures
    all_ended,
    load,
    plan_file,
    queue_url,
    runners,
    wait_registered,
    wait_until,
)

from kagura_agent.team import queue

pytestmark = pytest.mark.docker

APPEND = "echo applied >> applied.txt; sleep 1"


@pytest.mark.timeout(900)
def test_thirty_queued_runs_spread_over_three_runners_each_applied_once(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
) -> None:
    """30 runs on 15 project roots (two tasks each) over 3 runners: every run applied
    exactly once, by one runner, and the two runs of a root never overlap (the
    procrastinate lock on the root holds across runners)."""
    manifests = manifest_set(tmp_path)
    paths = []
    for index in range(15):
        project = make_project(tmp_path, f"p{index:02d}")
        for name in ("a", "b"):
            spec = {"steps": [APPEND], "verify": ["test -s applied.txt"]}
            paths.append(plan_file(project, f"p{index:02d}{name}", spec, manifests))
    crew = [runners(f"runner-{n}", "--concurrency", "2") for n in range(3)]
    wait_registered(queue_url, 3)
    queued = [queue.enqueue_plan(queue_url, load(path), who="test") for path in paths]

    rows = wait_until(lambda: all_ended(queue_url, 30), 800, "30 runs to end", step=1)
    failed = [r for r in rows if r["status"] != "success"]
    assert not failed, [(r["run_id"], r["status"], r["message"]) for r in failed]
    by_runner = collections.Counter(r["runner"] for r in rows)
    assert set(by_runner) == {r.name for r in crew}, by_runner
    # Each run id is in exactly one runner's own state directory.
    held = {r.name: set(run_ids(r.state_dir)) for r in crew}
    for item in queued:
        owners = [name for name, ids in held.items() if item.run_id in ids]
        assert len(owners) == 1, (item.run_id, owners)
    for row in rows:
        assert row["run_id"] in held[row["runner"]]
    # Each root saw its two runs applied once each, one after the other.
    for index in range(15):
        applied = (tmp_path / f"p{index:02d}" / "applied.txt").read_text().splitlines()
        assert applied == ["applied", "applied"], index
    spans = collections.defaultdict(list)
    for row in rows:
        spans[queue.run(queue_url, row["run_id"])["project_root"]].append(
            (row["started_at"], row["ended_at"])
        )
    for root, pair in spans.items():
        first, second = sorted(pair)
        assert first[1] <= second[0], (root, pair)


def test_a_plan_whose_approval_lapses_in_the_queue_is_refused(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
) -> None:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    path = plan_file(project, "late", {"steps": [APPEND]}, manifests)
    env = cli_env(state_dir, KAGURA_AGENT_QUEUE_URL=queue_url)
    done = kagura(["apply", "--queue", "--approval-ttl", "0.5", "--json", str(path)], env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    time.sleep(1.0)
    runners("late-runner")
    followed = kagura(["queue", "follow", run_id, "--timeout", "120"], env, timeout=180)
    assert followed.returncode == 6, followed.stdout + followed.stderr
    assert "approval expired while it was queued" in followed.stdout
    assert not (project / "applied.txt").exists()
    listed = kagura(["queue", "list", "--json"], env)
    [row] = json.loads(listed.stdout)["runs"]
    assert (row["status"], row["runner"]) == ("refused", "late-runner")


def test_queue_refuses_what_no_runner_may_apply(tmp_path: Path, state_dir: Path) -> None:
    """Refusals before any PostgreSQL is touched: a task file (not a reviewed plan), and
    a plan needing an approval nobody gave."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    path = plan_file(project, "net", {"steps": ["true"], "egress": ["pypi"]}, manifests)
    plan = load(path)
    needed = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
    assert needed, plan["approvals"]
    env = cli_env(state_dir, KAGURA_AGENT_QUEUE_URL="postgresql://nobody@127.0.0.1:1/none")
    done = kagura(["apply", "--queue", str(path)], env)
    assert done.returncode == 6, done.stderr
    assert "needs approval" in done.stderr
    task = kagura(["apply", "--queue", str(project / "task-net.yml")], env)
    assert task.returncode == 2
    assert "saved plan" in task.stderr
