"""kagura-agent doctor: preflight checks; exit 4 when any check fails."""

from __future__ import annotations

import argparse
from typing import Any

from kagura_agent.cli.common import add_manifest_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="check that this machine is ready to apply plans")
    add_manifest_option(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable results")
    parser.add_argument(
        "--project-root",
        metavar="DIR",
        help="the folder tasks will write (default: the current one; FAIL when named and unwritable)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.common import print_json
    from kagura_agent.doctor import run_checks
    from kagura_agent.errors import ExitCode

    checks = run_checks(args.manifests, args.project_root)
    failed = any(c.status == "FAIL" for c in checks)
    if args.json:
        print_json({"ok": not failed, "errors": [], "checks": [c.to_json() for c in checks]})
    else:
        print_checks(checks)
    return int(ExitCode.DOCTOR) if failed else 0


def print_checks(checks: list[Any]) -> bool:
    """One line per check and the verdict; True when any check failed."""
    from kagura_agent.ui import stdout_style

    style = stdout_style()
    colours = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}
    for check in checks:
        print(f"{style(check.status, colours[check.status])}  {check.name:<32} {check.detail}")
    failed = any(c.status == "FAIL" for c in checks)
    print("doctor: " + ("FAILING checks above" if failed else "ready"), flush=True)
    return failed
