"""``kagura-agent push BRANCH --to URL --credential PROVIDER/SCOPE``: an agent's branch to a
remote, after review; through a leased credential, never forced (agentgit/push.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kagura_agent.cli.common import add_manifest_option, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "push",
        help="push an agent's branch (kagura/<task>/run-<id>) to a remote: approved, leased, never forced",
        description=(
            "Push the branch a run with spec.commits: branch brought back, to the same name"
            " on the remote, with a credential leased from a CredentialProvider for the push"
            " and released after. Never forced; no hooks, tags or submodules."
        ),
    )
    parser.add_argument("branch", help="the agent's branch: kagura/<task>/run-<id>")
    parser.add_argument("--to", required=True, metavar="URL", help="the remote (https://…)")
    parser.add_argument(
        "--credential", required=True, metavar="PROVIDER/SCOPE", help="what to push with"
    )
    parser.add_argument(
        "--repo", default=".", metavar="DIR", help="the repository (default: the current folder)"
    )
    parser.add_argument("-y", "--yes", action="store_true", help="push without asking")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_manifest_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.agentgit.push import prepare, push
    from kagura_agent.errors import RefusedError
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.state import open_store

    catalog = load_workspace(args.manifests, []).catalog
    request = prepare(args.repo, args.branch, args.to, args.credential, catalog)
    if not args.json:
        print(request.describe(), file=sys.stderr)
    if not args.yes:
        if not sys.stdin.isatty():
            raise RefusedError("not confirmed: stdin is not a terminal", hint="pass --yes")
        if input("Push? [y/N] ").strip().lower() not in ("y", "yes"):
            raise RefusedError("not confirmed")
    with open_store() as store:
        done = push(request, store)
    if args.json:
        errors = [] if done.ok else [{"message": done.message}]
        print_json({"ok": done.ok, "errors": errors, **request.to_json(), "git": done.message})
    else:
        print(done.message)
    return 0 if done.ok else 1
