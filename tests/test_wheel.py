"""A wheel built from the repository works in a fresh venv outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(work / "dist"),
            str(ROOT),
        ],
        check=True,
    )
    wheels = list((work / "dist").glob("kagura_agent-*.whl"))
    assert len(wheels) == 1
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheels[0])], check=True)
    return env_dir


def _run(env_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(env_dir / "bin" / "kagura-agent"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(cwd / "home"),
            "KAGURA_AGENT_STATE_DIR": str(cwd / "state"),
        },
    )


def test_wheel_carries_schemas_and_default_manifests(installed: Path, tmp_path: Path) -> None:
    version = _run(installed, "--version", cwd=tmp_path)
    assert version.returncode == 0 and "kagura-agent" in version.stdout
    schema = _run(installed, "schema", "EgressPolicy", "--path", cwd=tmp_path)
    assert schema.returncode == 0
    assert "/site-packages/kagura_agent/data/schemas/egresspolicy.json" in schema.stdout
    valid = _run(installed, "validate", cwd=tmp_path)
    assert valid.returncode == 0, valid.stderr
    assert "site-packages/kagura_agent/data/manifests" in valid.stdout


def test_wheel_plans_a_task_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    task = project / "task.yml"
    task.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: outside}\n"
        "spec: {steps: [echo hi > hi.txt], verify: [test -f hi.txt]}\n"
    )
    result = _run(installed, "plan", "--json", str(task), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"applyable": true' in result.stdout
    assert str(ROOT) not in result.stdout
