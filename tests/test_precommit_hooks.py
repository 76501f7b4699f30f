"""The pre-commit hooks (.pre-commit-hooks.yaml), run by the real pre-commit in a temp repo.

pre-commit itself checks the hooks file (``validate-manifest``). The temp repository uses
the hooks as ``repo: local`` entries (language ``system``, this checkout's
``python -m kagura_agent`` as the entry), so nothing is fetched: the test exercises
exactly the ids, entries and ``files`` patterns this repository ships.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
PRE_COMMIT = shutil.which("pre-commit")
pytestmark = pytest.mark.skipif(
    PRE_COMMIT is None and not os.environ.get("CI"), reason="pip install pre-commit"
)

TASK = """apiVersion: kagura.dev/v1
kind: Task
metadata: {{name: {name}}}
spec:
  steps: [echo hi > hi.txt]
{extra}"""
PASTE = """apiVersion: kagura.dev/v1
kind: EgressPolicy
metadata: {name: paste}
spec:
  allow:
    - host: pastebin.com
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "ops"
    (repo / "manifests").mkdir(parents=True)
    (repo / "tasks").mkdir()
    (repo / "tasks").chmod(0o777)  # the project root the agent (uid 1000 under root) writes
    (repo / "manifests" / "paste.yml").write_text(PASTE)
    (repo / "tasks" / "hello.task.yml").write_text(TASK.format(name="hello", extra=""))
    (repo / "notes.yml").write_text("just: some yaml that is not ours\n")
    hooks = []
    for hook in HOOKS:
        words = hook["entry"].split()
        assert words[0] == "kagura-agent"
        entry = " ".join([sys.executable, "-m", "kagura_agent", *words[1:]])
        hooks.append({**hook, "language": "system", "entry": entry})
    config = {"repos": [{"repo": "local", "hooks": hooks}]}
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "ops@example.com")
    _git(repo, "config", "user.name", "ops")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "start")
    return repo


def _pre_commit(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PRE_COMMIT_HOME": str(repo.parent / "pre-commit-home"),
        "KAGURA_AGENT_STATE_DIR": str(repo.parent / "state"),
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [PRE_COMMIT or "pre-commit", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pre_commit_accepts_the_hooks_file() -> None:
    done = subprocess.run(
        [PRE_COMMIT or "pre-commit", "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [hook["id"] for hook in HOOKS] == ["kagura-validate", "kagura-plan"]


@pytest.mark.usefixtures("without_docker")
def test_the_hooks_pass_a_valid_repository(repo: Path) -> None:
    done = _pre_commit(repo, "run", "--all-files")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kagura-agent validate" in done.stdout and "Passed" in done.stdout


def test_kagura_validate_fails_a_mistyped_task(repo: Path) -> None:
    bad = repo / "tasks" / "typo.task.yml"
    bad.write_text(TASK.format(name="typo", extra="  egres: [paste]\n"))
    _git(repo, "add", "-A")
    done = _pre_commit(repo, "run", "kagura-validate")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tasks/typo.task.yml:6:3  $.spec.egres  unknown key 'egres'" in done.stdout


@pytest.mark.usefixtures("without_docker")
def test_kagura_plan_fails_a_task_whose_plan_is_not_applyable(repo: Path) -> None:
    (repo / "tasks" / "share.task.yml").write_text(
        TASK.format(name="share", extra="  egress: [paste]\n")
    )
    _git(repo, "add", "-A")
    validated = _pre_commit(repo, "run", "kagura-validate")
    assert validated.returncode == 0, validated.stdout  # valid, but ...
    done = _pre_commit(repo, "run", "kagura-plan")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DENY membrane/no-paste-sites" in done.stdout
    assert "not applyable: share" in done.stdout


EXAMPLE = ROOT / "examples" / "gitops" / ".pre-commit-config.yaml"


def test_the_example_config_is_the_shipped_hooks_as_local_ones() -> None:
    """The example pins nothing that could be missing (no tag, no URL): its hooks are
    .pre-commit-hooks.yaml's, run by the installed kagura-agent."""
    [repo] = yaml.safe_load(EXAMPLE.read_text())["repos"]
    assert repo["repo"] == "local" and "rev" not in repo
    keys = ("id", "name", "entry", "files", "require_serial")
    assert [{k: h[k] for k in keys} for h in repo["hooks"]] == [
        {k: h[k] for k in keys} for h in HOOKS
    ]
    assert {h["language"] for h in repo["hooks"]} == {"system"}


@pytest.mark.usefixtures("without_docker")
def test_the_example_config_runs_as_written(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example file itself, in a repository of manifests and tasks, with kagura-agent
    on PATH as an install puts it there: valid passes, a mistyped task fails."""
    shutil.copy(EXAMPLE, repo / ".pre-commit-config.yaml")
    bin_dir = repo.parent / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kagura-agent"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m kagura_agent "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    _git(repo, "add", "-A")
    done = _pre_commit(repo, "run", "--all-files")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kagura-agent validate" in done.stdout and "Passed" in done.stdout
    bad = repo / "tasks" / "typo.task.yml"
    bad.write_text(TASK.format(name="typo", extra="  egres: [paste]\n"))
    _git(repo, "add", "-A")
    failed = _pre_commit(repo, "run", "kagura-validate")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "unknown key 'egres'" in failed.stdout
