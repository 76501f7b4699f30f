"""Saved plans: written as JSON, read back with their fingerprint checked."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, cast

from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.inputfile import Unreadable, read_bytes
from kagura_agent.plan.intent import intent_fingerprint
from kagura_agent.plan.model import Plan, ShapeError, check_shape
from kagura_agent.plan.planner import FORMAT_VERSION, fingerprint

# A plan kagura-agent writes is a few KiB and a handful of levels deep; anything far
# outside that is refused before it reaches the fingerprint or a renderer (both recurse).
MAX_PLAN_BYTES = 8 * 2**20
MAX_PLAN_DEPTH = 32


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (iteratively: no recursion)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if deepest > MAX_PLAN_DEPTH:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def dumps(plan: Plan) -> str:
    return json.dumps(plan, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def save(plan: Plan, path: Path) -> None:
    """Write atomically: a crash never leaves half a plan behind.

    A path that cannot be written (a missing or read-only directory, /proc, a
    directory itself) is a UsageError naming the path; no temporary file is left.
    """
    temp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=".plan-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(dumps(plan))
        os.replace(temp, path)
    except OSError as exc:
        if temp:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"cannot write plan to {path}: {reason}", hint="give -o a file in a writable directory"
        ) from None


def load(path: Path) -> Plan:
    """Read a saved plan; refuse one whose content no longer matches its fingerprint.

    A plan whose fingerprint matches but whose shape is not a plan's (written by hand,
    by another tool, or with a recomputed fingerprint) is refused too, at the first
    place it differs from docs/plan-format.md, rather than failing later on a missing key.
    """
    try:
        raw = read_bytes(path, MAX_PLAN_BYTES)
    except Unreadable as exc:
        if exc.too_big:
            raise UsageError(
                f"{path} is larger than {MAX_PLAN_BYTES // 2**20} MiB: not a plan file"
            ) from None
        raise UsageError(f"cannot read plan {path}: {exc.reason}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}:{exc.colno}  not a plan file: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}  not a plan file: not UTF-8 text") from exc
    except RecursionError:
        raise UsageError(f"{path} is nested too deeply: not a plan file") from None
    if _depth(data) > MAX_PLAN_DEPTH:
        raise UsageError(f"{path} is nested deeper than {MAX_PLAN_DEPTH} levels: not a plan file")
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
    if data["intent"] != intent_fingerprint(data):
        raise RefusedError(
            f"plan {path} was changed after it was made (intent mismatch)",
            hint="make a new plan with `kagura-agent plan -o`",
        )
    return cast(Plan, data)
