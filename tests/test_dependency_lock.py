"""The dependency lock (requirements/*.txt): complete, consistent, hashed, and used.

One resolution (scripts/upgrade-deps) writes three files: all.txt (every extra and the
test tools: CI, ``scripts/install.sh dev``), main.txt (the core: ``scripts/install.sh``) and
agent.txt (the agent image's wheelhouse). These tests read them offline: a pyproject.toml
edited without re-locking, a pin without hashes, or two files disagreeing on a version
fails here, long before a fresh clone installs something nobody tested.
The docker test checks what the built agent image says it bakes against the lock and
against the CLI itself.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kagura_agent.membrane import images
from kagura_agent.membrane.build import wheelhouse_software

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
# The machine the lock is for: CI's and the agent image's CPython 3.11 on Linux.
TARGET = {
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$"
)


def _pins(name: str) -> dict[str, tuple[str, str | None, int]]:
    """``requirements/<name>`` as it applies to the target machine: project -> (version,
    marker, number of hashes). A universal lock may pin one project twice under disjoint
    markers (one version below Python 3.12, another above); exactly one must apply."""
    entries: list[tuple[str, str, str | None, int]] = []
    for line in (LOCKS / name).read_text().splitlines():
        match = PIN.match(line)
        if match:
            entries.append((canonicalize_name(match.group(1)), match.group(2), match.group(3), 0))
        elif entries and line.strip().startswith("--hash=sha256:"):
            project, version, marker, hashes = entries[-1]
            entries[-1] = (project, version, marker, hashes + 1)
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"{name}: a line the lock format does not have: {line!r}")
    pins: dict[str, tuple[str, str | None, int]] = {}
    for project, version, marker, hashes in entries:
        if marker is not None and not Marker(marker).evaluate(TARGET):
            continue
        assert project not in pins, f"{name}: {project} pinned twice for the target"
        pins[project] = (version, marker, hashes)
    return pins


def _applies(marker: str | None) -> bool:
    return marker is None or Marker(marker).evaluate(TARGET)


def _project() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return data


def _declared(extras: list[str]) -> list[Requirement]:
    project = _project()
    found = [Requirement(text) for text in project["dependencies"]]
    for extra in extras:
        found += [Requirement(text) for text in project["optional-dependencies"][extra]]
    return found


def _build_backend() -> list[Requirement]:
    lines = (LOCKS / "build.in").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    ("lock", "extras", "backend"),
    [
        ("all.txt", sorted(_project()["optional-dependencies"]), True),
        ("main.txt", [], True),
        ("agent.txt", ["claude", "brain", "aws"], False),
    ],
)
def test_every_declared_dependency_is_pinned_within_its_range(
    lock: str, extras: list[str], backend: bool
) -> None:
    pins = _pins(lock)
    wanted = _declared(extras) + (_build_backend() if backend else [])
    for requirement in wanted:
        if requirement.marker is not None and not requirement.marker.evaluate(TARGET):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, (
            f"{lock} does not pin {name} ({requirement}): run scripts/upgrade-deps --relock"
        )
        version = pins[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock} pins {name}=={version}, outside pyproject's {requirement}:"
            " run scripts/upgrade-deps --relock"
        )


@pytest.mark.parametrize("lock", ["all.txt", "main.txt", "agent.txt"])
def test_every_pin_carries_its_hashes(lock: str) -> None:
    pins = _pins(lock)
    assert len(pins) > 10
    unhashed = [name for name, (_, _, hashes) in pins.items() if hashes == 0]
    assert not unhashed, f"{lock}: pins without --hash: {unhashed}"


@pytest.mark.parametrize("lock", ["main.txt", "agent.txt"])
def test_a_package_has_one_version_in_every_lock_file(lock: str) -> None:
    everything = _pins("all.txt")
    for name, (version, marker, _) in _pins(lock).items():
        if not _applies(marker):
            continue
        assert name in everything, f"{lock} pins {name}, which all.txt does not"
        assert everything[name][0] == version, (
            f"{name}: {lock} pins {version}, all.txt {everything[name][0]}"
        )


def test_the_agent_lock_holds_no_test_tools() -> None:
    agent = _pins("agent.txt")
    for tool in ("pytest", "mypy", "ruff", "moto", "hypothesis", "uv"):
        assert tool not in agent, f"agent.txt pins the test tool {tool}"
    assert "claude-agent-sdk" in agent


def test_installs_and_ci_go_through_the_lock() -> None:
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "--require-hashes" in install and "--only-binary :all:" in install
    assert "requirements/main.txt" in install and "requirements/all.txt" in install
    readme_top = (ROOT / "README.md").read_text().split("## ", 1)[0]
    assert (
        "\npython3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh\n" in readme_top
    )
    assert "bash scripts/install.sh dev && bash scripts/test.sh" in readme_top
    assert "pip install -e" not in readme_top and "pip install ." not in readme_top
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install.sh dev && bash scripts/test.sh" in ci
    assert "pip install -e" not in ci
    # The wheelhouse is built from the agent lock, and the wheel ships the lock.
    assert images.lock_file() == ROOT / "requirements" / "agent.txt"
    assert '"requirements"' in (ROOT / "setup.py").read_text()


def test_upgrade_deps_explains_itself() -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "upgrade-deps"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "conformance" in proc.stdout and "requirements/all.txt" in proc.stdout
    wrong = subprocess.run(
        ["bash", str(ROOT / "scripts" / "upgrade-deps"), "--frobnicate"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert wrong.returncode == 2 and "unknown option --frobnicate" in wrong.stderr


def _wheel(folder: Path, name: str, files: dict[str, str]) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    (folder / name).write_bytes(buffer.getvalue())


def test_the_wheelhouse_names_the_sdk_and_the_cli_it_bundles(tmp_path: Path) -> None:
    _wheel(
        tmp_path,
        "claude_agent_sdk-0.2.190-py3-none-manylinux_2_17_x86_64.whl",
        {"claude_agent_sdk/_cli_version.py": '"""CLI."""\n\n__cli_version__ = "2.1.337"\n'},
    )
    _wheel(tmp_path, "kagura_brain-0.6.1-py3-none-any.whl", {"kagura_brain/__init__.py": ""})
    _wheel(tmp_path, "boto3-1.44.18-py3-none-any.whl", {"boto3/__init__.py": ""})
    assert wheelhouse_software(tmp_path) == {
        "claude-agent-sdk": "0.2.190",
        "claude-code": "2.1.337",
        "kagura-brain": "0.6.1",
    }


def test_the_agent_image_bakes_what_the_lock_pins_and_the_plan_shows_it(
    docker_client: Any, tmp_path: Path
) -> None:
    from resources import missing

    ref = images.image_ref("agent")
    [row] = [r for r in images.list_images() if r["ref"] == ref]
    if not row["built"]:
        missing(f"{ref} is not built (kagura-agent images build)")
    assert not row["stale"], f"{ref} is stale: {row['reason']} (kagura-agent images build agent)"
    software = row["software"]
    lock = _pins("agent.txt")
    assert software["claude-agent-sdk"] == lock["claude-agent-sdk"][0]
    assert software["kagura-brain"] == lock["kagura-brain"][0]
    # The CLI version on the label is the one the bundled binary reports.
    bundled = "/opt/kagura/lib/python3.11/site-packages/claude_agent_sdk/_bundled/claude"
    out = docker_client.containers.run(
        ref, ["--version"], entrypoint=[bundled], remove=True, network_disabled=True
    ).decode()
    assert software["claude-code"] in out, out
    # images list and plan show them.
    env = {"KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    listed = subprocess.run(
        [sys.executable, "-m", "kagura_agent", "images", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout
    assert f"claude-agent-sdk {software['claude-agent-sdk']}" in listed
    assert f"claude-code {software['claude-code']}" in listed
    planned = subprocess.run(
        [sys.executable, "-m", "kagura_agent", "plan", "--json", "examples/hello/task.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=ROOT,
    )
    [entry] = json.loads(planned.stdout)["plans"]
    plan = entry["plan"]
    assert plan["image"]["software"] == software
