"""Saved plans: written as JSON, read back with their fingerprint checked."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.plan.planner import FORMAT_VERSION, fingerprint


def dumps(plan: dict[str, Any]) -> str:
    return json.dumps(plan, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def save(plan: dict[str, Any], path: Path) -> None:
    """Write atomically: a crash never leaves half a plan behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".plan-", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(dumps(plan))
    os.replace(temp, path)


def load(path: Path) -> dict[str, Any]:
    """Read a saved plan; refuse one whose content no longer matches its fingerprint."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read plan {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}:{exc.colno}  not a plan file: {exc.msg}") from exc
    if not isinstance(plan, dict) or "format_version" not in plan:
        raise UsageError(f"{path} is not a kagura-agent plan (no format_version)")
    if plan["format_version"] != FORMAT_VERSION:
        raise UsageError(
            f"{path} has plan format {plan['format_version']}; this kagura-agent reads {FORMAT_VERSION}"
        )
    if plan.get("fingerprint") != fingerprint(plan):
        raise RefusedError(
            f"plan {path} was changed after it was made (fingerprint mismatch)",
            hint="make a new plan with `kagura-agent plan -o`",
        )
    return plan
