"""Helpers shared by command modules: output formats and manifest options."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Mapping
from typing import Any


def add_manifest_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--manifests",
        metavar="DIR",
        help="manifest directory (default: $KAGURA_AGENT_MANIFESTS, ./manifests, or the packaged set)",
    )


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


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
