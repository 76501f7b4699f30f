"""Images by digest from a registry, and plans applied on a second, separate Docker daemon.

The project's scripts start Debian's docker-registry on 127.0.0.1 (scripts/registry-up.sh)
and a second dockerd with its own socket, data root, exec root and network namespace
(scripts/dockerd2-up.sh; the session fixtures ``registry`` and ``dockerd2``, tests/daemon2.py). ``kagura-agent images push`` puts the agent image in the
registry; a plan made against the first daemon pins ``repository@sha256:…``; applied
with DOCKER_HOST pointing at the second daemon (and another state directory: another
host), apply pulls exactly that digest and runs there. A ``kill -9`` on that host is
swept there. A host whose image differs refuses with exit 6.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    kagura,
    leftovers,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)
from team_helpers import queue_url, runners, wait_registered, wait_until  # noqa: F401 - fixtures

from kagura_agent.plan import planfile
from kagura_agent.team import queue
from testing.egress_images import ensure_egress_images

pytestmark = pytest.mark.usefixtures("docker_client")
HELLO = {"steps": ["echo pulled > out.txt"], "verify": ["grep -q pulled out.txt"]}


@pytest.fixture(scope="module")
def pushed(
    tmp_path_factory: pytest.TempPathFactory, registry: str, docker_client: Any
) -> Iterator[tuple[Path, str]]:
    """A manifest set whose agent Image names the registry, and what ``images push`` printed."""
    base = tmp_path_factory.mktemp("pushed")
    manifests = manifest_set(base)
    images = manifests / "images.yml"
    text = images.read_text()
    repository = f"{registry}/kagura/agent"
    images.write_text(
        text.replace(
            "  tag: kagura/agent:0.1.0\n",
            f"  tag: kagura/agent:0.1.0\n  repository: {repository}\n",
            1,
        )
    )
    done = kagura(
        ["images", "push", "agent", "--json", "--manifests", str(manifests)],
        cli_env(base / "state"),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    pushed = json.loads(done.stdout)
    assert (pushed["ok"], pushed["errors"]) == (True, []), pushed
    (row,) = pushed["images"]
    assert row["pushed"].startswith(repository + "@sha256:"), row
    yield manifests, row["pushed"]
    with contextlib.suppress(Exception):  # the push's tag; the image itself stays
        docker_client.api.remove_image(f"{repository}:0.1.0")


def _plan(
    base: Path, manifests: Path, name: str, spec: dict[str, Any]
) -> tuple[Path, Path, dict[str, Any]]:
    project = make_project(base, name)
    task = write_task(project, name, spec)
    saved = base / f"{name}.json"
    made = kagura(
        ["plan", "--manifests", str(manifests), "-o", str(saved), str(task)],
        cli_env(base / "state-a"),
    )
    assert made.returncode == 0, made.stderr
    return project, saved, json.loads(saved.read_text())


def test_the_plan_pins_the_pushed_digest(
    tmp_path: Path, pushed: tuple[Path, str], docker_client: Any
) -> None:
    manifests, reference = pushed
    _, _, plan = _plan(tmp_path, manifests, "pinned", HELLO)
    assert plan["image"]["pull"] == reference
    assert plan["image"]["digest"] == docker_client.images.get("kagura/agent:0.1.0").id
    assert not [w for w in plan["warnings"] if "not pushed" in w]


def test_a_plan_applies_on_a_second_daemon_pulling_by_digest(
    tmp_path: Path, pushed: tuple[Path, str], dockerd2: Any, docker_client: Any
) -> None:
    manifests, reference = pushed
    project, saved, plan = _plan(tmp_path, manifests, "travel", HELLO)
    digest = plan["image"]["digest"]
    for image in dockerd2.images.list(all=True):  # the second host starts without it
        if image.id == digest:
            dockerd2.images.remove(image.id, force=True)
    host_b = cli_env(tmp_path / "state-b", DOCKER_HOST=dockerd2.host)
    started = int(time.time()) - 1
    done = kagura(["apply", "--json", str(saved)], host_b, timeout=900)
    assert done.returncode == 0, done.stderr
    assert f"pulling {reference}" in done.stderr and f"pulled {reference}" in done.stderr
    assert json.loads(done.stdout)["outcome"] == "success"
    assert (project / "out.txt").read_text() == "pulled\n"
    assert dockerd2.images.get(digest).id == digest
    (run_id,) = run_ids(tmp_path / "state-b")
    # It ran on the second daemon: the first never saw a container of that run.
    label = {"label": f"dev.kagura.run={run_id}", "type": "container"}
    ended = int(time.time()) + 1
    on_b = list(dockerd2.events(since=started, until=ended, decode=True, filters=label))
    on_a = list(docker_client.events(since=started, until=ended, decode=True, filters=label))
    assert [e for e in on_b if e.get("Action") == "create"] and on_a == []
    assert leftovers(docker_client, run_id) == [] and leftovers(dockerd2, run_id) == []


def test_kill_9_on_the_second_daemon_is_swept_there(
    tmp_path: Path, pushed: tuple[Path, str], dockerd2: Any
) -> None:
    manifests, _ = pushed
    _, saved, _ = _plan(tmp_path, manifests, "killed", {"steps": ["sleep 600"]})
    state_b = tmp_path / "state-b"
    host_b = cli_env(state_b, DOCKER_HOST=dockerd2.host)
    proc = spawn(["apply", "--json", str(saved)], host_b)
    dead = wait_for_run(state_b, proc, timeout=600)
    wait_for_container(dockerd2, dead, timeout=600)
    proc.kill()  # SIGKILL: no clean-up of its own
    proc.wait(timeout=30)
    assert leftovers(dockerd2, dead) != []

    _, again, _ = _plan(tmp_path, manifests, "after", HELLO)
    done = kagura(["apply", "--json", str(again)], host_b, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "removed what crashed runs left" in done.stderr
    assert leftovers(dockerd2, dead) == []
    assert run_row(state_b, dead)["outcome"] == "crashed"


def test_a_runner_on_the_second_daemon_pulls_and_applies_a_queued_plan(
    tmp_path: Path,
    pushed: tuple[Path, str],
    dockerd2: Any,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
) -> None:
    """``kagura-agent runner`` with DOCKER_HOST on the second daemon takes a plan made on
    the first from the queue, pulls its image by digest and applies it there."""
    manifests, reference = pushed
    project, saved, plan = _plan(tmp_path, manifests, "queued", HELLO)
    digest = plan["image"]["digest"]
    if any(image.id == digest for image in dockerd2.images.list(all=True)):
        dockerd2.images.remove(digest, force=True)
    runner = runners("runner-d2", env={"DOCKER_HOST": dockerd2.host})
    wait_registered(queue_url, 1)
    queued = queue.enqueue_plan(queue_url, planfile.load(saved), who="op")
    wait_until(
        lambda: queue.run(queue_url, queued.run_id)["status"] in queue.TERMINAL, 600, "the run"
    )
    row = queue.run(queue_url, queued.run_id)
    assert (row["status"], row["runner"]) == ("success", "runner-d2"), (row, runner.output())
    events = json.dumps(list(queue.follow(queue_url, queued.run_id, timeout=60)))
    assert f"pulling {reference}" in events, events[-3000:]
    assert (project / "out.txt").read_text() == "pulled\n"
    assert dockerd2.images.get(digest).id == digest
    assert leftovers(dockerd2, queued.run_id) == []


def test_a_host_whose_image_differs_refuses(
    tmp_path: Path, dockerd2: Any, docker_client: Any
) -> None:
    """No repository: the plan pins an ID the second daemon has never seen → exit 6."""
    manifests = manifest_set(tmp_path)
    _, saved, plan = _plan(tmp_path, manifests, "unpushed", HELLO)
    assert plan["image"]["pull"] is None
    if any(image.id == plan["image"]["digest"] for image in dockerd2.images.list(all=True)):
        dockerd2.images.remove(plan["image"]["digest"], force=True)
    state_b = tmp_path / "state-b"
    done = kagura(["apply", str(saved)], cli_env(state_b, DOCKER_HOST=dockerd2.host))
    assert done.returncode == 6, done.stderr
    assert "differs on this Docker host" in done.stderr and plan["image"]["digest"] in done.stderr
    assert run_ids(state_b) == []


def test_the_second_daemon_leaves_the_first_daemons_default_bridge(
    dockerd2: Any, docker_client: Any
) -> None:
    """A second dockerd must not delete docker0 (a daemon started with `--bridge none`
    does): the first daemon's builds and default-network containers need it."""
    assert dockerd2.ping()
    base = ensure_egress_images(docker_client)["base"]
    output = docker_client.containers.run(base, ["echo", "bridged"], remove=True)
    assert output.strip() == b"bridged"
