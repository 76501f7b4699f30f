"""``kagura-agent review --base REV``: the PR comment, against a real git repository.

The repository has a main branch and a feature branch with two commits: one changes a
task and adds another (only those are planned), one changes a manifest (then every task
under --tasks is planned). The comment starts with the marker the CI workflow looks for.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kagura_agent import gitops
from testing import forked

ROOT = Path(__file__).resolve().parents[1]
TASK = "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {{name: {name}}}\nspec:\n  steps: [echo hi]\n{extra}"
MIRROR = """apiVersion: kagura.dev/v1
kind: EgressPolicy
metadata: {{name: mirror}}
spec:
  allow:
    - host: {host}
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _write(repo: Path, name: str, text: str) -> None:
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "ops"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "ops@example.com")
    _git(repo, "config", "user.name", "ops")
    _write(repo, "manifests/mirror.yml", MIRROR.format(host="mirror.example.com"))
    for name in ("hello", "other"):
        _write(repo, f"tasks/{name}.task.yml", TASK.format(name=name, extra=""))
    (repo / "tasks").chmod(0o777)  # writable by the agent, so plans are applyable as root
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    _git(repo, "checkout", "-q", "-b", "feature")
    _write(repo, "tasks/hello.task.yml", TASK.format(name="hello", extra="  egress: [mirror]\n"))
    _write(repo, "tasks/new.task.yml", TASK.format(name="new", extra=""))
    _write(repo, "notes.yml", "not: a task\n")
    _write(repo, ".github/workflows/ci.yml", "on: push\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "change hello, add new")
    return repo


def test_selection_is_the_changed_tasks(repo: Path) -> None:
    changed = gitops.changed_files("main", repo)
    assert changed == [
        ".github/workflows/ci.yml",
        "notes.yml",
        "tasks/hello.task.yml",
        "tasks/new.task.yml",
    ]
    tasks, manifests = gitops.select_tasks(changed, repo, repo / "manifests", [repo / "tasks"])
    assert [t.name for t in tasks] == ["hello.task.yml", "new.task.yml"]
    assert manifests == []


def test_a_manifest_change_plans_every_task_under_tasks(repo: Path) -> None:
    _write(repo, "manifests/mirror.yml", MIRROR.format(host="mirror2.example.com"))
    _git(repo, "commit", "-q", "-am", "move the mirror")
    changed = gitops.changed_files("main", repo)
    tasks, manifests = gitops.select_tasks(changed, repo, repo / "manifests", [repo / "tasks"])
    assert [t.name for t in tasks] == ["hello.task.yml", "new.task.yml", "other.task.yml"]
    assert manifests == ["manifests/mirror.yml"]
    # Without --tasks folders only the changed task files are planned.
    tasks, _ = gitops.select_tasks(changed, repo, repo / "manifests", [])
    assert [t.name for t in tasks] == ["hello.task.yml", "new.task.yml"]


def _review(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KAGURA_AGENT_STATE_DIR": str(repo.parent / "state"),
    }
    return forked.run(["review", "--base", "main", *args], cwd=repo, env=env, timeout=120).text()


@pytest.mark.usefixtures("without_docker")
def test_the_comment_body(repo: Path) -> None:
    _write(repo, "manifests/mirror.yml", MIRROR.format(host="mirror2.example.com"))
    _git(repo, "commit", "-q", "-am", "move the mirror")
    done = _review(repo, "--tasks", "tasks", "-o", "comment.md")
    assert done.returncode == 0, done.stderr
    body = (repo / "comment.md").read_text()
    assert body.startswith(gitops.MARKER + "\n## kagura-agent plan against `main`\n")
    assert "Changed manifests: `manifests/mirror.yml`" in body
    for name in ("hello", "new", "other"):
        assert f"### kagura-agent plan: `{name}`" in body
    hello = body.split("### kagura-agent plan: `hello`")[1].split("### kagura-agent plan:")[0]
    # The egress row with its class, the approvals section, and the diff against main.
    assert "| egress | `https://mirror2.example.com:443` (policy mirror" in hello
    assert "| needs-approval |" in hello
    assert "#### Approvals" in hello and "--approve egress:mirror" in hello
    # Against hello as it was at main (no egress then) with main's manifests: the egress
    # the branch added is new, and it widens what the task gets.
    assert "**Widens against the task file and manifests at main**" in hello
    assert "+ egress mirror2.example.com:443 (policy mirror)  (widens)" in hello
    assert "mirror.example.com" not in hello


def test_nothing_to_plan_says_so(repo: Path) -> None:
    _git(repo, "checkout", "-q", "main")
    done = _review(repo)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout
        == f"{gitops.MARKER}\n## kagura-agent plan against `main`\n\nNo task or manifest change to plan.\n"
    )


@pytest.mark.usefixtures("without_docker")
def test_a_broken_task_is_reported_in_the_comment(repo: Path) -> None:
    _write(repo, "tasks/broken.task.yml", TASK.format(name="broken", extra="  egres: [x]\n"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "typo")
    done = _review(repo)
    assert done.returncode == 2
    assert (
        "> **error**: `tasks/broken.task.yml`: tasks/broken.task.yml:6:3  $.spec.egres"
        "  unknown key 'egres'"
    ) in done.stdout
