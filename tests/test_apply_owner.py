"""The agent runs as the project root's owner — never as root — and so does verify."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, leftovers, run_ids, write_task


def _project(tmp_path: Path, uid: int) -> Path:
    root = tmp_path / f"owned-by-{uid}"
    root.mkdir()
    os.chown(root, uid, uid)
    return root


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_agent_and_verify_run_as_the_owner(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    project = _project(tmp_path, 1234)
    task = write_task(
        project,
        "owner",
        {
            "steps": ["id -u > uid.txt"],
            "verify": ['test "$(id -u)" = 1234', "grep -qx 1234 uid.txt"],
        },
    )
    os.chown(task, 1234, 1234)
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", str(task)], env)
    assert done.returncode == 0, done.stderr
    assert (project / "uid.txt").stat().st_uid == 1234
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def _plan_with_owner(tmp_path: Path, owner: list[int], mode: int) -> dict[str, Any]:
    from kagura_agent.plan.build import plan_tasks

    project = tmp_path / "p"
    project.mkdir()
    task = write_task(project, "owned", {"steps": ["echo hi > out.txt"]})
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"project_owner": owner, "project_mode": mode}))
    [plan] = plan_tasks(None, [str(task)], facts_file=str(facts))
    return plan


@pytest.mark.parametrize(
    ("owner", "mode", "user", "fix"),
    [
        # root's folder: the agent could not write it; chown makes the agent its owner
        ([0, 0], 0o755, "1000:1000", "chown -R 1000:1000 {p}"),
        ([0, 0], 0o777, "1000:1000", None),  # ... unless everyone may write it
        ([0, 0], 0o000, "1000:1000", "chown -R 1000:1000 {p} && chmod u+rwx {p}"),
        ([1234, 1234], 0o755, "1234:1234", None),  # the owner's folder: the agent is the owner
        # read-only, or 000 (the agent's own chmod 000), even for its owner: chown changes
        # nothing there, its mode is what must change
        ([1234, 1234], 0o555, "1234:1234", "chmod u+rwx {p}"),
        ([1234, 1234], 0o000, "1234:1234", "chmod u+rwx {p}"),
        ([1234, 1234], 0o677, "1234:1234", "chmod u+rwx {p}"),  # write without search
        ([1234, 0], 0o775, "1000:1000", "chown -R 1000:1000 {p}"),  # a root group never is
    ],
)
def test_plan_refuses_up_front_a_project_root_the_agent_cannot_write(
    tmp_path: Path, owner: list[int], mode: int, user: str, fix: str | None
) -> None:
    applyable = fix is None
    plan = _plan_with_owner(tmp_path, owner, mode)
    assert plan["hardening"]["user"] == user
    assert plan["applyable"] is applyable
    assert not [w for w in plan["warnings"] if "refused" in w]  # refusals are data, apart
    if applyable:
        assert plan["refusals"] == []
    else:
        [refusal] = plan["refusals"]
        assert refusal["code"] == "project-unwritable"
        assert refusal["source"] == "$.task.project_root"
        assert refusal["message"].endswith(f"fix: {fix.format(p=tmp_path / 'p')}")


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned project needs root to create")
@pytest.mark.usefixtures("without_docker")
def test_a_root_owned_project_never_runs_the_agent_as_root(tmp_path: Path, state_dir: Path) -> None:
    """The README's hello as root: plan says NO with the fix, apply refuses before Docker."""
    project = _project(tmp_path, 0)
    project.chmod(0o755)
    task = write_task(project, "rooted", {"steps": ["true"]})
    # A plan that is not applyable exits 6; --allow-unapplyable shows it with exit 0.
    assert kagura(["plan", "--json", str(task)], cli_env(state_dir)).returncode == 6
    done = kagura(["plan", "--json", "--allow-unapplyable", str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plans"][0]["plan"]
    assert plan["hardening"]["user"] == "1000:1000"
    assert plan["applyable"] is False
    assert any(
        "owned by root" in r["message"] and "chown -R 1000:1000" in r["message"]
        for r in plan["refusals"]
    )
    refused = kagura(["apply", "--yes", str(task)], cli_env(state_dir))
    assert refused.returncode == 6, refused.stderr
    assert f"fix: chown -R 1000:1000 {project}" in refused.stderr
    assert run_ids(state_dir) == []
