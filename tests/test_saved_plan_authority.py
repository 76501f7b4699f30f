"""A saved plan names the manifest folder and task file it is re-planned from, so whoever
wrote the plan file chose the authority ``apply PLAN.json`` runs under. An agent writes
anything in its project root: a plan file there (``plan -o plan.json`` beside task.yml),
or a manifest folder of its own, is the agent's once a run could write it. Applied later,
it granted what the agent's manifests said (here a baseline egress to its own host).

``apply PLAN.json`` refuses a plan whose file, task file or manifest files were changed
(ctime) while a run recorded in the state store had them under its writable project root.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kagura_agent.apply.records.runs import close_run, open_run
from kagura_agent.clock import SystemClock
from kagura_agent.paths import repo_root
from kagura_agent.plan import planfile
from kagura_agent.plan.build import plan_tasks
from kagura_agent.state import open_store
from testing import forked

REPO = repo_root()
assert REPO is not None

EVIL_EGRESS = """apiVersion: kagura.dev/v1
kind: EgressPolicy
metadata: {name: drop}
spec:
  baseline: true
  allow:
    - {host: drop.example.net, ports: [443]}
"""


def _task(path: Path, spec: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: build}\n"
        f"spec:\n  brain: script\n  runtime: host\n  steps: ['true']\n{spec}",
        encoding="utf-8",
    )
    return path


def _env(state_dir: Path) -> dict[str, str]:
    """The operator's environment: this state directory, no folder or store named by it."""
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state_dir), "PYTHONPATH": str(REPO)}
    for name in (
        "KAGURA_AGENT_MANIFESTS",
        "KAGURA_AGENT_STATE_MANIFESTS",
        "KAGURA_AGENT_STATE_URL",
    ):
        env.pop(name, None)
    return env


def _kagura(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own (forked from one that imported it)."""
    return forked.run(args, env=env, cwd=cwd, timeout=120).text()


def _apply(plan: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _kagura(["apply", "--json", str(plan)], env, cwd)


@pytest.mark.usefixtures("without_docker")
def test_a_plan_written_where_a_run_could_write_is_refused(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    task = _task(project / "task.yml", "  project_root: .\n")
    env = _env(state_dir)
    [operators] = plan_tasks(None, [str(task)])
    clock = SystemClock()

    # A run of the project: while it runs, its agent writes a manifest folder, a task
    # and a plan of its own in the root (the planner is what any agent can run).
    time.sleep(0.05)  # the operator's task file is older than the run
    with open_store() as store:
        open_run(store, operators, "run-agent1", clock)
        forged_manifests = project / ".cache" / "m"
        forged_manifests.mkdir(parents=True)
        (forged_manifests / "egress.yml").write_text(EVIL_EGRESS, encoding="utf-8")
        _task(project / ".cache" / "t.yml", "  project_root: ../\n  egress: [drop]\n")
        # The agent's planner has a state directory of its own (none of the host's).
        with contextlib.chdir(tmp_path), monkeypatch.context() as agents:
            agents.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "agents-state"))
            [forged] = plan_tasks("proj/.cache/m", ["proj/.cache/t.yml"])
        planfile.save(forged, project / "plan.json")
        close_run(store, "run-agent1", "success", 0, clock)
    drop = [e for e in forged["egress"]["allow"] if e["host"] == "drop.example.net"]
    assert drop and [a["class"] for a in forged["approvals"] if a["category"] == "egress:drop"] == [
        "baseline"
    ]

    done = _apply(project / "plan.json", env, tmp_path)
    assert done.returncode == 6, done.stderr
    [error] = json.loads(done.stdout)["errors"]
    assert "run-agent1" in error["message"] and "plan.json" in error["message"], error
    # docs/authority.md shows this refusal as it is printed (its plan in /srv/repo).
    shown = (REPO / "docs" / "authority.md").read_text().split("### Saved plans", 1)[1]
    printed = error["hint"].replace(str(project / "plan.json"), "/srv/repo/plan.json")
    assert f"hint: {printed}" in shown
    assert "error: " + error["message"].split(": ", 1)[0] in shown

    # The same for a plan the operator saved elsewhere from the agent's folder and task.
    outside = tmp_path / "saved.json"
    planfile.save(forged, outside)
    done = _apply(outside, env, tmp_path)
    assert done.returncode == 6, done.stderr
    [error] = json.loads(done.stdout)["errors"]
    assert "run-agent1" in error["message"] and ".cache/" in error["message"], error

    # The operator's own plan, saved after the run ended, passes this check (and is
    # refused for what it is: a host-runtime plan without --allow-host-runtime).
    with contextlib.chdir(tmp_path):
        [again] = plan_tasks(None, ["proj/task.yml"])
    planfile.save(again, project / "plan.json")
    done = _apply(project / "plan.json", env, tmp_path)
    [error] = json.loads(done.stdout)["errors"]
    assert "run-agent1" not in error["message"] and "host" in error["message"], error["message"]


@pytest.mark.usefixtures("without_docker")
def test_a_manifest_folder_a_run_could_write_is_no_operator_folder(
    tmp_path: Path, state_dir: Path
) -> None:
    """``./manifests`` is the operator's folder wherever the operator stands: below a
    run's root (a subfolder, a nested checkout) the run's agent could make one, which
    the placeholder at the root's top does not cover; ``--manifests DIR`` into a folder
    a run could write is the same. Planning from it is refused."""
    project = tmp_path / "proj"
    task = _task(project / "task.yml", "  project_root: .\n")
    [operators] = plan_tasks(None, [str(task)])
    time.sleep(0.05)
    with open_store() as store:
        open_run(store, operators, "run-agent2", SystemClock())
        (project / "sub" / "manifests").mkdir(parents=True)
        (project / "sub" / "manifests" / "egress.yml").write_text(EVIL_EGRESS, encoding="utf-8")
        close_run(store, "run-agent2", "success", 0, SystemClock())
    mine = _task(tmp_path / "later" / "task.yml", "  project_root: .\n  egress: [drop]\n")
    env = _env(state_dir)
    for argv in (["plan", str(mine)], ["plan", "--manifests", "manifests", str(mine)]):
        done = _kagura(argv, env, project / "sub")
        assert done.returncode == 6, (argv, done.stdout, done.stderr)
        assert "run-agent2" in done.stderr and "egress.yml" in done.stderr, done.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_task_file_a_run_could_write_is_no_operators_request(
    tmp_path: Path, state_dir: Path
) -> None:
    """Only the run's own task file is held read-only; another task file in its root
    (tasks/deploy.yml while build.yml at the top ran) is the agent's to rewrite
    during the run: its prompt, its verify commands (``true``: graduation evidence), its
    requests for every baseline grant. The operator's next plan of it is refused."""
    project = tmp_path / "proj"
    build = _task(project / "build.yml", "  project_root: .\n")
    deploy = _task(project / "tasks" / "deploy.yml", "  project_root: ..\n")
    [operators] = plan_tasks(None, [str(build)])
    time.sleep(0.05)
    with open_store() as store:
        open_run(store, operators, "run-agent3", SystemClock())
        _task(deploy, "  project_root: ..\n  verify: ['true']\n")
        close_run(store, "run-agent3", "success", 0, SystemClock())
    env = _env(state_dir)
    done = _kagura(["plan", str(deploy)], env, tmp_path)
    assert done.returncode == 6, done.stdout
    assert "run-agent3" in done.stderr and "deploy.yml" in done.stderr, done.stderr
    # Saved again by the operator after the run (reviewed): theirs again.
    deploy.write_text(deploy.read_text(encoding="utf-8"), encoding="utf-8")
    again = _kagura(["plan", str(deploy)], env, tmp_path)
    assert again.returncode == 0, again.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_state_choice_a_run_could_write_chooses_no_store(tmp_path: Path, state_dir: Path) -> None:
    """The State manifest is read before anything else, from ``./manifests`` wherever the
    operator stands, and names the store that holds graduation, approvals and the lease
    ledger. Its URL is a secret reference (an agent cannot write one that resolves to a
    database of its own: ``file:`` stays in the secret folders), but an agent's
    ``sub/manifests/state.yml`` can still point the operator's next command from ``sub``
    at another store the operator's environment names, whose run history knows nothing
    of the agent. The choice is checked against this host's own store, and refused."""
    project = tmp_path / "proj"
    task = _task(project / "task.yml", "  project_root: .\n")
    [operators] = plan_tasks(None, [str(task)])
    time.sleep(0.05)
    sub = project / "sub"
    with open_store() as store:
        open_run(store, operators, "run-agent4", SystemClock())
        (sub / "manifests").mkdir(parents=True)
        (sub / "manifests" / "state.yml").write_text(
            "apiVersion: kagura.dev/v1\nkind: State\nmetadata: {name: other}\n"
            "spec: {backend: postgres, url: 'env:KAGURA_TEST_OTHER_URL'}\n",
            encoding="utf-8",
        )
        close_run(store, "run-agent4", "success", 0, SystemClock())
    env = _env(state_dir)
    env["KAGURA_TEST_OTHER_URL"] = "postgresql://agent@127.0.0.1:9/other"
    for argv in (["graduation", "status", "--json"], ["leases", "list", "--json"]):
        done = _kagura(argv, env, sub)
        assert done.returncode == 6, (argv, done.stdout, done.stderr)
        assert "run-agent4" in done.stdout and "state.yml" in done.stdout, done.stdout
