"""The README's examples run as written: sample plan output, the approval line and its hint.

The sample outputs are checked against what ``plan`` prints today (with fixed facts, so
image digests and the daemon do not matter): every line shown must come out, in order; a
line ending in "…" is a prefix, and a lone "…" stands for lines left out.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from testing import forked

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The checkout path the README's samples show.
SHOWN_ROOT = "/home/me/kagura-agent"
FACTS = {
    "image_digests": {"kagura/agent:0.1.0": "sha256:290d3ba93efc" + "0" * 52},
    "project_owner": [1000, 1000],
    "project_mode": 0o755,
    "daemon": {"userns_remap": True, "rootless": False},
}


def _samples() -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of every ``$ kagura-agent plan …`` block."""
    found = []
    for block in re.findall(r"```\n(\$ kagura-agent plan [^\n]+)\n(.*?)```", README, re.S):
        command, output = block
        found.append((command.removeprefix("$ "), output.rstrip("\n").splitlines()))
    return found


def _kagura(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return forked.run(args, cwd=cwd, env=env, timeout=120).text()


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDFLARE")}
    return {
        **clean,
        "PYTHONPATH": str(ROOT),
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"),
        "NO_COLOR": "1",
    }


def test_the_readme_shows_plan_samples() -> None:
    assert [command for command, _ in _samples()] == [
        "kagura-agent plan examples/dns-change/task.yml",
        "kagura-agent plan --manifests examples/denied-paste/manifests examples/denied-paste/task.yml",
    ]


@pytest.mark.parametrize(("command", "shown"), _samples(), ids=lambda v: str(v)[:40])
def test_readme_plan_sample_is_what_plan_prints(
    command: str, shown: list[str], tmp_path: Path, env: dict[str, str]
) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS))
    args = shlex.split(command)[1:]
    done = _kagura([*args, "--facts", str(facts)], env, ROOT)
    # A plan apply would refuse makes plan exit 6 too (README: the exit codes).
    refused = any(line.strip() == "applyable    NO" for line in shown)
    assert done.returncode == (6 if refused else 0), done.stderr
    printed = done.stdout.replace(str(ROOT), SHOWN_ROOT).splitlines()
    at = 0
    for line in shown:
        if line.strip() == "…":
            continue
        prefix = line.endswith("…")
        want = line.removesuffix("…")
        while at < len(printed) and not (
            printed[at].startswith(want) if prefix else printed[at] == line
        ):
            at += 1
        assert at < len(printed), f"README line not printed (in order): {line!r}\n{done.stdout}"
        at += 1


def _readme_apply_line() -> list[str]:
    [line] = [
        line
        for line in README.splitlines()
        if line.startswith("kagura-agent apply --yes --approve")
    ]
    return shlex.split(line.split("#")[0])[1:]


@pytest.mark.usefixtures("docker_client")
def test_readme_approval_example_passes_the_approvals(tmp_path: Path, env: dict[str, str]) -> None:
    """As written it gets past approvals (it stops at the Cloudflare secret, unset here)."""
    project = tmp_path / "examples" / "dns-change"
    shutil.copytree(ROOT / "examples" / "dns-change", project)
    project.chmod(0o777)  # writable by the agent whoever runs the test
    done = _kagura(_readme_apply_line(), env, tmp_path)
    assert done.returncode == 3, done.stderr
    assert "secret env:CLOUDFLARE_ROOT_TOKEN is not set" in done.stderr
    assert "no approval" not in done.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_partial_approval_names_the_missing_flag(tmp_path: Path, env: dict[str, str]) -> None:
    project = tmp_path / "examples" / "dns-change"
    shutil.copytree(ROOT / "examples" / "dns-change", project)
    project.chmod(0o777)
    args = [a for a in _readme_apply_line() if a not in ("--approve", "egress:cloudflare-api")]
    args.insert(args.index("credential:cloudflare/dns-write"), "--approve")
    done = _kagura(args, env, tmp_path)
    assert done.returncode == 6, done.stderr
    assert "no approval for this plan" in done.stderr
    assert "hint: also pass --approve egress:cloudflare-api, or apply without --yes" in done.stderr
    assert "bound to one plan" not in done.stderr
