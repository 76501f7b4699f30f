"""A wheel built from the repository works in a fresh venv outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Without PYTHONPATH: a checkout on it (with its egg-info) reads as "already installed",
# and the venv's python would import the checkout instead of the wheel.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kagura_agent.membrane.source import package_source

    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy, as the image build does: a build writes build/ into its source,
    # and another build of the checkout at once (an image on another worker) races it.
    with package_source(work / "src") as source:
        dist = str(work / "dist")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, str(source)],
            check=True,
        )
    wheels = list((work / "dist").glob("kagura_agent-*.whl"))
    assert len(wheels) == 1
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheels[0])], check=True, env=CLEAN_ENV
    )
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
            # The test's Docker (tests/conftest.py: none, unless it uses docker_client).
            **{k: v for k, v in os.environ.items() if k == "DOCKER_HOST"},
        },
    )


def test_wheel_carries_schemas_and_default_manifests(installed_wheel: Path, tmp_path: Path) -> None:
    version = _run(installed_wheel, "--version", cwd=tmp_path)
    assert version.returncode == 0 and "kagura-agent" in version.stdout
    schema = _run(installed_wheel, "schema", "EgressPolicy", "--path", cwd=tmp_path)
    assert schema.returncode == 0
    assert "/site-packages/kagura_agent/data/schemas/egresspolicy.json" in schema.stdout
    valid = _run(installed_wheel, "validate", cwd=tmp_path)
    assert valid.returncode == 0, valid.stderr
    assert "site-packages/kagura_agent/data/manifests" in valid.stdout


@pytest.mark.usefixtures("without_docker")
def test_wheel_plans_a_task_outside_the_checkout(installed_wheel: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o777)  # the agent (uid 1000 when we are root) may write it
    task = project / "task.yml"
    task.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: outside}\n"
        "spec: {steps: [echo hi > hi.txt], verify: [test -f hi.txt]}\n"
    )
    result = _run(installed_wheel, "plan", "--json", str(task), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["plans"][0]["plan"]["applyable"] is True
    assert str(ROOT) not in result.stdout


@pytest.mark.usefixtures("without_docker")
def test_wheel_lists_and_finds_the_image_recipes_outside_the_checkout(
    installed_wheel: Path, tmp_path: Path
) -> None:
    from kagura_agent.membrane.images import recipe_digest

    listing = _run(installed_wheel, "images", "list", "--json", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = {row["name"]: row for row in json.loads(listing.stdout)["images"]}
    assert list(rows) == ["base", "python", "agent", "egress-proxy"]
    # The packaged recipes are the checkout's, byte for byte.
    for name, row in rows.items():
        assert row["recipe_digest"] == recipe_digest(ROOT / "images" / name)
    plan = _run(
        installed_wheel,
        "plan",
        "--json",
        "--allow-unapplyable",  # a root-owned checkout is refused; the recipe is shown
        str(ROOT / "examples/hello/task.yml"),
        cwd=tmp_path,
    )
    assert plan.returncode == 0, plan.stderr
    recipe = json.loads(plan.stdout)["plans"][0]["plan"]["image"]
    assert recipe["recipe_digest"] == recipe_digest(ROOT / "images" / "agent"), recipe


@pytest.mark.usefixtures("without_docker")
def test_wheel_synthesises_a_buildable_source_for_the_agent_image(
    installed_wheel: Path, tmp_path: Path
) -> None:
    """Outside a checkout the agent image's wheelhouse is built from the installed package."""
    out = tmp_path / "src"
    script = (
        "import shutil, sys, tempfile\n"
        "from pathlib import Path\n"
        "from kagura_agent.membrane.source import package_source\n"
        "with tempfile.TemporaryDirectory() as t, package_source(Path(t)) as root:\n"
        "    shutil.copytree(root, sys.argv[1])\n"
    )
    made = subprocess.run(
        [str(installed_wheel / "bin" / "python"), "-c", script, str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
    )
    assert made.returncode == 0, made.stderr
    pyproject = (out / "pyproject.toml").read_text()
    assert '"claude" = ["claude-agent-sdk>=0.1"]' in pyproject
    assert (out / "kagura_agent" / "data" / "images" / "agent" / "Dockerfile").is_file()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "w"),
            str(out),
        ],
        check=True,
    )
    [wheel] = (tmp_path / "w").glob("kagura_agent-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "kagura_agent/data/images/agent/Dockerfile" in names
    assert "kagura_agent/data/manifests/images.yml" in names
    # The agent image's dependency lock travels with the wheel: `images build` outside a
    # checkout installs the same pinned, hashed dependencies.
    assert "kagura_agent/data/requirements/agent.txt" in names
