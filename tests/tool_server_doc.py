"""docs/authority.md's tool server example, for the tests that run it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DOC = Path(__file__).resolve().parents[1] / "docs" / "authority.md"


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split("## Tool servers", 1)[1].split("\n## ", 1)[0]


def example() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The section's manifests (its yaml block) and its task (the plain block after)."""
    text = section()
    manifests = re.search(r"```yaml\n(.*?)```", text, re.S)
    task = re.search(r"```\n(apiVersion: kagura.dev/v1\nkind: Task.*?)```", text, re.S)
    assert manifests and task, "docs/authority.md lost its tool server example"
    return list(yaml.safe_load_all(manifests[1])), yaml.safe_load(task[1])


def shown_plan_lines() -> list[str]:
    """The plan lines the section shows (its block starting with ``tool servers``)."""
    block = re.search(r"```\n(  tool servers .*?)```", section(), re.S)
    assert block, "docs/authority.md lost its plan excerpt"
    return block[1].splitlines()
