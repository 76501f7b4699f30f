"""Saved plans: written as JSON, read back with their fingerprint checked."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import cast

from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.plan.model import Plan, ShapeError, check_shape
from kagura_agent.plan.planner import FORMAT_VERSION, fingerprint


def dumps(plan: Plan) -> str:
    return json.dumps(plan, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def save(plan: Plan, path: Path) -> None:
    """Write atomically: a crash never leaves half a plan behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".plan-", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(dumps(plan))
    os.replace(temp, path)


def load(path: Path) -> Plan:
    """Read a saved plan; refuse one whose content no longer matches its fingerprint.

    A plan whose fingerprint matches but whose shape is not a plan's (written by hand,
    by another tool, or with a recomputed fingerprint) is refused too, at the first
    place it differs from docs/plan-format.md, rather than failing later on a missing key.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read plan {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}:{exc.colno}  not a plan file: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}  not a plan file: not UTF-8 text") from exc
    if not isinstance(data, dict) or "format_version" not in data:
        raise UsageError(f"{path} is not a kagura-agent plan (no format_version)")
    if data["format_version"] != FORMAT_VERSION:
        raise UsageError(
            f"{path} has plan format {data['format_version']!r}; this kagura-agent reads {FORMAT_VERSION}"
        )
    if data.get("fingerprint") != fingerprint(data):
        raise RefusedError(
            f"plan {path} was changed after it was made (fingerprint mismatch)",
            hint="make a new plan with `kagura-agent plan -o`",
        )
    try:
        check_shape(data, Plan)
    except ShapeError as exc:
        raise UsageError(
            f"{path}  {exc.path}  malformed plan: {exc.message}",
            hint="make a new plan with `kagura-agent plan -o`",
        ) from exc
    return cast(Plan, data)
