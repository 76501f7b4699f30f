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
from apply_helpers import (
    cli_env,
    kagura,
    make_project,
    manifest_set,
    run_containers,
    run_ids,
    wait_for_container,
)
from team_helpers import (  # noqa: F401 - fixtures
    HEARTBEAT,
    STALLED_AFTER,
    all_ended,
    load,
    plan_file,
    queue_url,
    runners,
    wait_registered,
    wait_until,
)

from kagura_agent.team import queue
from testing.fake_cloudflare import ROOT_TOKEN

pytestmark = pytest.mark.usefixtures("docker_client")

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
            paths.append(plan_file(project, name, spec, manifests))
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


def cloudflare_provider(fake: Any) -> dict[str, Any]:
    """A revocable provider on the local Cloudflare fake: a scoped token minted per run."""
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": "cf"},
        "spec": {
            "type": "cloudflare",
            "secret": "env:KAGURA_TEST_CF_ROOT",
            "cloudflare": {
                "account_id": "0123456789abcdef0123456789abcdef",
                "endpoint": fake.url + "/client/v4",
                "endpoint_addresses": ["127.0.0.1/32"],
            },
            "baseline_scopes": ["dns-read"],
            "scopes": {
                "dns-read": {
                    "description": "read the test zone",
                    "permission_groups": ["82e64a83756745bbbb1c9c2701bf816b"],
                    "resources": {"com.cloudflare.api.account.zone.*": "*"},
                }
            },
        },
    }


@pytest.mark.timeout(600)
def test_a_runner_killed_mid_run_is_reaped_by_another(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
    cloudflare: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill -9 of the runner applying a run: another runner sees its heartbeat stop,
    marks the run lost and revokes its lease at the provider from the shared ledger;
    nothing applies the run a second time; the dead runner's container is swept when it
    comes back. The runners share the team's PostgreSQL state store (leases, runs)."""
    monkeypatch.setenv("KAGURA_AGENT_STATE_URL", queue_url)
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    shared = {"KAGURA_AGENT_STATE_URL": queue_url, "KAGURA_TEST_CF_ROOT": ROOT_TOKEN}
    manifests = manifest_set(tmp_path, cloudflare_provider(cloudflare))
    project = make_project(tmp_path)
    spec = {
        "steps": [APPEND + "; sleep 600"],
        "credentials": [{"provider": "cf", "scope": "dns-read"}],
    }
    plan = load(plan_file(project, "long", spec, manifests))
    doomed = runners("doomed", env=shared)
    wait_registered(queue_url, 1)
    queued = queue.enqueue_plan(queue_url, plan, who="test")
    container = wait_for_container(docker_client, queued.run_id, timeout=120)
    assert len(cloudflare.live_tokens()) == 1
    # Mid-run: its step has begun (a running container may still be loading its brain,
    # and a runner killed then leaves a run that never started its step).
    applied = project / "applied.txt"
    wait_until(applied.exists, 120, "the step under way")
    survivor = runners("survivor", env=shared)
    wait_registered(queue_url, 2)

    doomed.kill9()
    killed = time.monotonic()
    wait_until(
        lambda: (
            queue.run(queue_url, queued.run_id)["status"] == "lost" and not cloudflare.live_tokens()
        ),
        60,
        "the run marked lost and its token revoked",
        step=0.1,
    )
    noticed = time.monotonic() - killed
    # Revoked centrally, by the survivor, while the dead runner is still gone.
    assert doomed.proc is not None and doomed.proc.poll() is not None
    assert queue.run(queue_url, queued.run_id)["runner"] == "doomed"
    assert noticed < STALLED_AFTER + 15, noticed
    env = cli_env(state_dir, KAGURA_AGENT_QUEUE_URL=queue_url, **shared)
    followed = kagura(["queue", "follow", queued.run_id, "--timeout", "30"], env)
    assert followed.returncode == 1, followed.stdout + followed.stderr
    assert "run lost: runner doomed stopped heartbeating" in followed.stdout
    assert "1 of 1 open lease(s) revoked by runner survivor" in followed.stdout
    # Never applied a second time: one taker, one agent container, the job failed (no retry).
    time.sleep(3 * HEARTBEAT + STALLED_AFTER)
    items = [
        json.loads(line)
        for line in kagura(
            ["queue", "follow", queued.run_id, "--json", "--timeout", "30"], env
        ).stdout.splitlines()
    ]
    assert [i["runner"] for i in items if i["kind"] == "runner"] == ["doomed"]
    agents = [
        c for c in run_containers(docker_client, queued.run_id) if "dev.kagura.task" in c.labels
    ]
    assert [c.id for c in agents] == [container.id]
    assert (project / "applied.txt").read_text().splitlines() == ["applied"]
    assert "survivor: applying" not in survivor.output()

    # The dead runner comes back (same name, same state directory): it sweeps its leftovers.
    runners("doomed", env=shared)
    wait_until(lambda: not run_containers(docker_client, queued.run_id), 60, "the sweep")
    assert queue.run(queue_url, queued.run_id)["status"] == "lost"


# The shipped Graduation knobs, quickened: two successes of one task over one second.
QUICK_GRADUATION = (
    "apiVersion: kagura.dev/v1\nkind: Graduation\nmetadata:\n  name: default\n"
    "spec:\n  min_successes: 2\n  min_distinct_tasks: 1\n  cooldown: 1s\n"
)
SLOW_LANE = {
    "kind": "EgressPolicy",
    "metadata": {"name": "slow-lane"},
    "spec": {"allow": [{"host": "nowhere.test"}]},
}


@pytest.mark.timeout(600)
def test_graduation_earned_on_one_runner_unlocks_on_another(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two approved runs on runner A earn egress:slow-lane its evidence in the shared
    state store; the operator graduates it; runner B then applies a plan that needs no
    approval for it any more."""
    monkeypatch.setenv("KAGURA_AGENT_STATE_URL", queue_url)
    shared = {"KAGURA_AGENT_STATE_URL": queue_url}
    manifests = manifest_set(tmp_path, SLOW_LANE)
    (manifests / "graduation.yml").write_text(QUICK_GRADUATION)
    project = make_project(tmp_path)
    spec = {"steps": ["echo ok > out.txt"], "verify": ["test -s out.txt"], "egress": ["slow-lane"]}
    first = load(plan_file(project, "earn", spec, manifests))
    [asked] = [a for a in first["approvals"] if a["category"] == "egress:slow-lane"]
    assert asked["class"] == "needs-approval"
    runner_a = runners("runner-a", env=shared)
    wait_registered(queue_url, 1)
    for _ in range(2):
        # Planned afresh each time: the evidence of the last run is an input of the next
        # plan. Runner A's memory of the first run is a fact the planning host lacks: it
        # changes no capability, so the plan still applies there.
        fresh = load(plan_file(project, "earn", spec, manifests))
        queued = queue.enqueue_plan(queue_url, fresh, approve=["egress:slow-lane"], who="op")
        wait_until(
            lambda q=queued: (
                queue.run(queue_url, q.run_id)["status"] != "queued"
                and queue.run(queue_url, q.run_id)["status"] in queue.TERMINAL
            ),
            180,
            "run",
        )
        row = queue.run(queue_url, queued.run_id)
        assert row["status"] == "success", row["message"]
        time.sleep(1.1)  # the evidence spans the cooldown
    runner_a.stop()

    env = cli_env(state_dir, **shared)
    approved = kagura(
        ["graduation", "approve", "egress:slow-lane", "--who", "op", "--manifests", str(manifests)],
        env,
    )
    assert approved.returncode == 0, approved.stdout + approved.stderr
    second = load(plan_file(project, "unlocked", spec, manifests))
    [now] = [a for a in second["approvals"] if a["category"] == "egress:slow-lane"]
    assert now["class"] == "graduated"
    runners("runner-b", env=shared)
    queued = queue.enqueue_plan(queue_url, second, who="op")
    wait_until(lambda: queue.run(queue_url, queued.run_id)["status"] in queue.TERMINAL, 180, "run")
    row = queue.run(queue_url, queued.run_id)
    assert (row["status"], row["runner"]) == ("success", "runner-b"), row
