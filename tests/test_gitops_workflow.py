"""examples/gitops's GitHub Actions workflow, read as Actions would run it: it installs
kagura-agent from a checkout of the commit the operator reviewed, through that checkout's
own lock (scripts/install.sh), never by name from the package index, where kagura-agent
is another project; and each kagura-agent command it runs parses."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from kagura_agent.cli.main import cached_parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "gitops" / ".github" / "workflows" / "kagura-plan.yml"


def _steps() -> list[dict[str, Any]]:
    document = yaml.safe_load(WORKFLOW.read_text())
    steps: list[dict[str, Any]] = document["jobs"]["plan"]["steps"]
    return steps


def test_kagura_agent_is_installed_from_the_reviewed_checkout_through_its_lock() -> None:
    steps = _steps()
    runs = [str(step.get("run", "")) for step in steps]
    assert not any("pip install" in run for run in runs), runs
    [checkout] = [s for s in steps if s.get("with", {}).get("path") == ".kagura-agent"]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"]["repository"] == "${{ vars.KAGURA_AGENT_REPOSITORY }}"
    assert checkout["with"]["ref"] == "${{ vars.KAGURA_AGENT_REF }}"
    [install] = [s for s in steps if s.get("name") == "Install kagura-agent"]
    assert install["run"].strip() == "bash .kagura-agent/scripts/install.sh"
    assert (ROOT / "scripts" / "install.sh").is_file()
    # Installed before it is used.
    first_use = next(i for i, run in enumerate(runs) if "kagura-agent review" in run)
    assert steps.index(checkout) < steps.index(install) < first_use


def test_each_kagura_agent_command_of_the_workflow_parses() -> None:
    parser = cached_parser()
    commands = [
        line.strip()
        for step in _steps()
        for line in str(step.get("run", "")).splitlines()
        if line.strip().startswith("kagura-agent ")
    ]
    assert commands, "the workflow runs kagura-agent"
    for command in commands:
        argv = shlex.split(command.replace('"origin/${{ github.base_ref }}"', "origin/main"))
        parser.parse_args(argv[1:])
