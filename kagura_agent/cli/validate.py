"""kagura-agent validate [PATH...]: every problem in the manifests and tasks, at once."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kagura_agent.cli.common import add_manifest_option, print_json
from kagura_agent.errors import ValidationError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate", help="check manifests and tasks; report every error with its location"
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="task or manifest files and folders"
    )
    add_manifest_option(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable diagnostics")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.manifest.workspace import layers_report, layers_summary, load_workspace

    try:
        workspace = load_workspace(args.manifests, args.paths)
    except ValidationError as exc:
        if args.json:
            from kagura_agent.cli.common import error_envelope

            print_json({**error_envelope(exc), "valid": False})
            return int(exc.exit_code)
        raise
    kinds = sum(len(workspace.catalog.of(k)) for k in workspace.catalog.by_kind)
    if args.json:
        print_json(
            {
                "ok": True,
                "valid": True,
                "errors": [],
                "manifests": kinds,
                "tasks": len(workspace.tasks),
                "layers": layers_report(workspace.catalog),
                "overrides": list(workspace.catalog.overrides),
            }
        )
    else:
        print(
            f"ok: {kinds} manifests in {workspace.manifest_dir} and {len(workspace.tasks)} tasks are valid",
            file=sys.stdout,
        )
        print(f"layers: {layers_summary(workspace.catalog)}", file=sys.stdout)
    return 0
