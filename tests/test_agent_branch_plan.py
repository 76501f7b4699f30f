"""The plan of a task asking for its commits as a branch (``spec.commits: branch``): what
it shows, when it is refused, and the membrane floor holding its two mounts together.

A real git repository in a temporary project root; plans compiled by the planner (facts
gathered by agentgit/base.py through host git), no Docker.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import write_task

from kagura_agent.membrane.floor import AGENT_GIT, OPERATOR_GIT, floor_violations
from kagura_agent.membrane.hardening import ContainerSpec, container_kwargs
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.plan.render import render_text
from kagura_agent.ui import Style

pytestmark = pytest.mark.usefixtures("without_docker")


def _repo(root: Path, commits: int = 1) -> str:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    for number in range(commits):
        (root / "file").write_text(f"{number}\n")
        subprocess.run(["git", "-C", str(root), "add", "file"], check=True)
        ident = ["-c", "user.email=a@b.invalid", "-c", "user.name=a"]
        subprocess.run(
            ["git", "-C", str(root), *ident, "commit", "-q", "-m", f"c{number}"], check=True
        )
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return head


def _plan(root: Path, manifests: Path | None = None, **spec: Any) -> Plan:
    task = write_task(root, "fix", {"steps": ["true"], "commits": "branch", **spec})
    (plan,) = plan_tasks(str(manifests) if manifests else None, [str(task)])
    return plan


def test_the_plan_shows_the_branch_and_moves_git_aside(tmp_path: Path, state_dir: Path) -> None:
    root = tmp_path / "project"
    head = _repo(root)
    plan = _plan(root)
    commits = plan["commits"]
    assert commits["problem"] is None
    assert not [r for r in plan["refusals"] if r["code"] == "commits-unavailable"]
    assert (commits["seed"], commits["head"]) == (head, "refs/heads/main")
    assert commits["branch"] == "kagura/fix/<run>"
    [git] = [m for m in plan["mounts"] if m["source"] == str(root / ".git")]
    assert (git["target"], git["mode"]) == (OPERATOR_GIT, "ro")
    tmpfs = plan["hardening"]["tmpfs"][AGENT_GIT]
    assert "noexec" in tmpfs and "uid=" in tmpfs and f"size={commits['repo_bytes']}" in tmpfs
    text = render_text(plan, Style(False))
    assert f"commits      branch kagura/fix/<run> of {root}/.git" in text
    assert f"seeded from {head[:12]} on main" in text and "nothing is pushed" in text
    # A new commit of the operator's moves the seed, a fact: what is approved stays.
    (root / "file").write_text("later\n")
    ident = ["-c", "user.email=a@b.invalid", "-c", "user.name=a"]
    subprocess.run(["git", "-C", str(root), *ident, "commit", "-qam", "later"], check=True)
    again = _plan(root)
    assert again["commits"]["seed"] != head and again["intent"] == plan["intent"]


def test_a_plan_without_the_branch_keeps_git_read_only_in_place(
    tmp_path: Path, state_dir: Path
) -> None:
    root = tmp_path / "project"
    _repo(root)
    task = write_task(root, "fix", {"steps": ["true"]})
    (plan,) = plan_tasks(None, [str(task)])
    assert "commits" not in plan and AGENT_GIT not in plan["hardening"]["tmpfs"]
    [git] = [m for m in plan["mounts"] if m["source"] == str(root / ".git")]
    assert git["target"] == AGENT_GIT


def _worktree(tmp_path: Path) -> Path:
    main = tmp_path / "main"
    _repo(main)
    linked = tmp_path / "linked"
    subprocess.run(
        ["git", "-C", str(main), "worktree", "add", "-q", str(linked), "-b", "side"], check=True
    )
    return linked


def _empty(tmp_path: Path) -> Path:
    root = tmp_path / "empty"
    _repo(root, commits=0)
    return root


def _not_a_repo(tmp_path: Path) -> Path:
    root = tmp_path / "plain"
    root.mkdir()
    return root


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_not_a_repo, "is not a git work tree"),
        (_empty, "HEAD has no commit yet"),
        (_worktree, "is not a folder (a linked worktree"),
    ],
)
def test_a_root_that_cannot_hold_the_branch_is_refused(
    tmp_path: Path, state_dir: Path, make: Any, says: str
) -> None:
    plan = _plan(make(tmp_path))
    assert not plan["applyable"]
    [refusal] = [r for r in plan["refusals"] if r["code"] == "commits-unavailable"]
    assert says in refusal["message"], refusal
    # Refused, the plan keeps .git read-only where it is: nothing moved.
    assert AGENT_GIT not in plan["hardening"]["tmpfs"]


def test_the_brain_on_the_host_or_a_writable_git_is_refused(
    tmp_path: Path, state_dir: Path
) -> None:
    root = tmp_path / "project"
    _repo(root)
    hosted = _plan(root, runtime="host")
    assert "the brain runs on the host" in str(hosted["commits"]["problem"])
    folder = tmp_path / "ops"
    folder.mkdir()
    (folder / "policy.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: open}\n"
        "spec: {writable_git: true}\n"
    )
    writable = _plan(root, manifests=folder)
    assert "writable_git: true" in str(writable["commits"]["problem"])
    assert not hosted["applyable"] and not writable["applyable"]


def test_the_floor_never_leaves_the_operators_git_writable(tmp_path: Path, state_dir: Path) -> None:
    """The operator's .git moved aside only with the agent's tmpfs over /workspace/.git:
    without it, /workspace/.git would be the host's .git through the writable root."""
    root = tmp_path / "project"
    _repo(root)
    plan = _plan(root)
    assert floor_violations(plan) == []
    edited = copy.deepcopy(plan)
    del edited["hardening"]["tmpfs"][AGENT_GIT]
    assert any("leaves /workspace/.git writable" in v for v in floor_violations(edited))
    elsewhere = copy.deepcopy(plan)
    elsewhere["hardening"]["tmpfs"]["/workspace/src"] = elsewhere["hardening"]["tmpfs"].pop(
        AGENT_GIT
    )
    assert any("/workspace/src would hide /workspace" in v for v in floor_violations(elsewhere))


def test_verify_sees_the_operators_repository_where_git_looks(
    tmp_path: Path, state_dir: Path
) -> None:
    root = tmp_path / "project"
    _repo(root)
    plan = _plan(root)
    agent = container_kwargs(ContainerSpec(plan, "run-x", role="agent"))
    verify = container_kwargs(ContainerSpec(plan, "run-x", role="verify"))
    assert AGENT_GIT in agent["tmpfs"] and AGENT_GIT not in verify["tmpfs"]
    targets = {m["Source"]: (m["Target"], m["ReadOnly"]) for m in verify["mounts"]}
    assert targets[str(root / ".git")] == (AGENT_GIT, True)
    agent_targets = {m["Source"]: m["Target"] for m in agent["mounts"]}
    assert agent_targets[str(root / ".git")] == OPERATOR_GIT


def test_the_membrane_page_task_plans_as_it_says(tmp_path: Path, state_dir: Path) -> None:
    """docs/membrane.md's task, in a repository of its own: it plans the branch it shows."""
    page = (Path(__file__).parents[1] / "docs" / "membrane.md").read_text(encoding="utf-8")
    start = page.index("metadata: {name: fix-parser}")
    block = page[page.rindex("```", 0, start) + 3 : page.index("```", start)]
    root = tmp_path / "parser"
    _repo(root)
    task = root / "task.yml"
    task.write_text(block.lstrip("\n"), encoding="utf-8")
    (plan,) = plan_tasks(None, [str(task)])
    assert plan["commits"]["branch"] == "kagura/fix-parser/<run>"
    assert plan["commits"]["problem"] is None
    assert "commits  branch kagura/fix-parser/<run> of" in page
