"""Helpers shared by command modules: output formats and manifest options."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

from kagura_agent.hygiene import json_text


def count(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``low..high`` (a row count reaches SQL, where
    a number past 64 bits is an OverflowError and a negative LIMIT means no limit)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not in {low}..{high}")
        return value

    return parse


def seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in ``low..high`` (nan and inf reach
    sleeps and clocks, where they are a ValueError or OverflowError)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not in {low:g}..{high:g} seconds")
        return value

    return parse


def add_manifest_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--manifests",
        metavar="DIR",
        help="manifest directory (default: $KAGURA_AGENT_MANIFESTS, ./manifests, or the packaged set)",
    )


def print_json(value: Any) -> None:
    """``value`` as JSON on stdout: characters a terminal would act on are \\u escapes."""
    sys.stdout.write(json_text(json.dumps(value, indent=2, ensure_ascii=False)) + "\n")


def print_ok(body: Mapping[str, Any]) -> None:
    """The ``--json`` shape of a success: ``{"ok": true, "errors": [], ...body}``."""
    if "ok" in body or "errors" in body:
        raise ValueError("a --json body may not carry the envelope's own keys")
    print_json({"ok": True, "errors": [], **body})


def wants_json(args: argparse.Namespace | None, argv: list[str]) -> bool:
    """Did the command line ask for JSON (``--json`` or ``--format json``)?"""
    if args is not None:
        return bool(getattr(args, "json", False)) or getattr(args, "format", None) == "json"
    return "--json" in argv or "--format=json" in argv or _follows(argv, "--format", "json")


def _follows(argv: list[str], flag: str, value: str) -> bool:
    return any(a == flag and b == value for a, b in itertools.pairwise(argv))


def error_envelope(exc: Any) -> dict[str, Any]:
    """The ``--json`` shape of a failure: the same envelope as success, ``ok`` false."""
    return {
        "ok": False,
        "exit_code": int(exc.exit_code),
        "errors": exc.diagnostics_json(),
    }


def say_daemon_notice(plans: list[Mapping[str, Any]]) -> None:
    """On stderr, once per Docker daemon: it puts no container in a user namespace (a
    plan no longer carries this warning every time; doctor says it every time)."""
    daemons = [plan["inputs"]["facts"].get("daemon") for plan in plans]
    shared = next(
        (d for d in daemons if d is not None and not (d.get("userns_remap") or d.get("rootless"))),
        None,
    )
    if shared is None:
        return
    from kagura_agent.membrane.images import daemon_info
    from kagura_agent.membrane.isolation import notice_once
    from kagura_agent.paths import state_dir

    notice = notice_once(shared, daemon_info(), state_dir() / "daemons-told")
    if notice is not None:
        print(f"warning: {notice}", file=sys.stderr)
