"""GitOps review sees what a branch changed in its tasks, not only in its manifests.

A branch that only edits a task — adds the ``aws-sts`` egress policy and raises the wall
budget from 20m to 45m — was "no changes against the manifests at main" (exit 0 under
``--detailed-exitcode``) and its review comment had no diff: the base plan was compiled
from the branch's own task file. Here every task is planned from its file at the base,
every manifest is compared, what widens a grant comes first, and a task that does not
validate is named with file:line in the comment.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kagura_agent import gitops
from testing import forked

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("without_docker")

TASK = """apiVersion: kagura.dev/v1
kind: Task
metadata: {{name: {name}}}
spec:
  project_root: ../../work
  steps: [echo hi]
  budget: {{wall_time: {wall}}}
{extra}"""
PROVIDER = """apiVersion: kagura.dev/v1
kind: CredentialProvider
metadata: {{name: gh}}
spec:
  type: github-app
  secret: env:GH_KEY
  ttl: {ttl}
  github: {{app_id: "1", installation_id: "2"}}
  scopes:
    site:
      repositories: [site]
      permissions: {{contents: {level}}}
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _write(repo: Path, name: str, text: str) -> None:
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _kagura(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KAGURA_AGENT_STATE_DIR": str(repo.parent / "state"),
        "NO_COLOR": "1",
    }
    # A child of the fork server (testing/forked.py): a real process, without an
    # interpreter start and the package's imports per command.
    return forked.run(args, cwd=repo, env=env, timeout=120).text()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """main: two tasks and an operator folder; branch ``feature`` made by each test."""
    repo = tmp_path / "ops"
    repo.mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work").chmod(0o777)  # writable by the agent: plans are applyable as root
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "ops@example.com")
    _git(repo, "config", "user.name", "ops")
    _write(repo, "manifests/gh.yml", PROVIDER.format(ttl="15m", level="read"))
    _write(repo, "tasks/deploy.task.yml", TASK.format(name="deploy", wall="20m", extra=""))
    _write(repo, "tasks/other.task.yml", TASK.format(name="other", wall="20m", extra=""))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    _git(repo, "checkout", "-q", "-b", "feature")
    return repo


def _commit(repo: Path, message: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)


def _widen_the_task(repo: Path) -> None:
    text = TASK.format(name="deploy", wall="45m", extra="  egress: [aws-sts]\n")
    _write(repo, "tasks/deploy.task.yml", text)
    _commit(repo, "deploy: reach STS, for longer")


def test_plan_base_diffs_a_task_only_change_and_counts_it(repo: Path) -> None:
    _widen_the_task(repo)
    args = ["plan", "tasks/", "--manifests", "manifests", "--base", "main"]
    done = _kagura(repo, *args, "--detailed-exitcode")
    assert done.returncode == 5, done.stdout + done.stderr
    deploy = done.stdout.split("Plan for task deploy")[1].split("Plan for task")[0]
    assert "changes against the task and manifests at main:" in deploy
    widened = [line.strip() for line in deploy.splitlines() if line.endswith("(widens)")]
    assert widened == [
        "+ egress *.amazonaws.com:443 (policy aws-sts)  (widens)",
        "+ egress sts.amazonaws.com:443 (policy aws-sts)  (widens)",
        "~ budget wall_seconds 1200 → 2700  (widens)",
    ], deploy
    # Widened changes come before any other change of the plan.
    listed = deploy.split("changes against")[1].splitlines()[1:]
    marks = [line.endswith("(widens)") for line in listed if line.startswith("    ")]
    assert marks == sorted(marks, reverse=True)
    other = done.stdout.split("Plan for task other")[1]
    assert "no changes against the task and manifests at main" in other
    as_json = json.loads(_kagura(repo, *args, "--json").stdout)
    assert as_json["changed"] is True
    [entry] = [e for e in as_json["plans"] if e["task"] == "deploy"]
    assert {
        "op": "~",
        "section": "budget",
        "text": "wall_seconds 1200 → 2700",
        "widens": True,
    } in entry["changes"]
    assert as_json["base"]["manifest_changes"] == [] and as_json["base"]["removed_tasks"] == []


def test_plan_base_without_changes_exits_0(repo: Path) -> None:
    done = _kagura(
        repo, "plan", "tasks/", "--manifests", "manifests", "--base", "main", "--detailed-exitcode"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No manifest changes against the manifests at main." in done.stdout


def test_a_manifest_change_no_task_uses_yet_is_a_widened_change(repo: Path) -> None:
    _write(repo, "manifests/gh.yml", PROVIDER.format(ttl="1h", level="write"))
    _write(
        repo,
        "manifests/paste.yml",
        "apiVersion: kagura.dev/v1\nkind: EgressPolicy\nmetadata: {name: mirror}\n"
        "spec:\n  baseline: true\n  allow: [{host: mirror.example.com}]\n",
    )
    _commit(repo, "widen the provider, add a policy")
    done = _kagura(
        repo, "plan", "tasks/", "--manifests", "manifests", "--base", "main", "--detailed-exitcode"
    )
    assert done.returncode == 5, done.stdout + done.stderr
    changes = done.stdout.split("Manifest changes against the manifests at main:")[1]
    assert "+ manifest EgressPolicy mirror (manifests/paste.yml)  (widens)" in changes
    assert (
        "~ manifest CredentialProvider gh (manifests/gh.yml): spec.scopes.site.permissions.contents,"
        " spec.ttl; widens: spec.scopes.site.permissions.contents, spec.ttl  (widens)"
    ) in changes


def test_review_comment_puts_widened_grants_first_with_the_diff(repo: Path) -> None:
    _widen_the_task(repo)
    done = _kagura(repo, "review", "--base", "main", "--manifests", "manifests", "-o", "c.md")
    assert done.returncode == 0, done.stderr
    body = (repo / "c.md").read_text()
    head, plans = body.split("### kagura-agent plan: `deploy`")
    assert "### Widened grants (3)" in head
    assert "+ egress sts.amazonaws.com:443 (policy aws-sts)  (widens)  [task deploy]" in head
    assert "~ budget wall_seconds 1200 → 2700  (widens)  [task deploy]" in head
    assert "**Widens against the task file and manifests at main** (3):" in plans


def test_review_names_each_validation_error_with_its_line(repo: Path) -> None:
    _write(
        repo,
        "tasks/broken.task.yml",
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: broken}\nspec:\n"
        "  steps: [echo hi]\n  egres: [x]\n",
    )
    _commit(repo, "typo")
    done = _kagura(repo, "review", "--base", "main", "--manifests", "manifests")
    assert done.returncode == 2
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("> **error**")]
    assert "`tasks/broken.task.yml`: tasks/broken.task.yml:6:3  $.spec.egres  unknown key" in line
    assert "1 validation error" not in line


def test_review_lists_a_removed_task(repo: Path) -> None:
    (repo / "tasks" / "other.task.yml").unlink()
    _commit(repo, "retire other")
    assert gitops.removed_task_files("main", repo) == ["tasks/other.task.yml"]
    done = _kagura(repo, "review", "--base", "main", "--manifests", "manifests")
    assert done.returncode == 0, done.stderr
    assert "Removed task files: `tasks/other.task.yml`" in done.stdout
    planned = _kagura(
        repo, "plan", "tasks/", "--manifests", "manifests", "--base", "main", "--detailed-exitcode"
    )
    assert planned.returncode == 5
    assert "Task removed since main: other (tasks/other.task.yml)" in planned.stdout
