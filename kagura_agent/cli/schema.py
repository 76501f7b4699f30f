"""kagura-agent schema [KIND]: print the JSON Schema of a manifest kind (or list them)."""

from __future__ import annotations

import argparse
from typing import Any

from kagura_agent.errors import UsageError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schema", help="print a manifest kind's JSON Schema (for editors)"
    )
    parser.add_argument(
        "kind", nargs="?", help="Brain, Image, CredentialProvider, … (default: list kinds)"
    )
    parser.add_argument("--path", action="store_true", help="print the schema file's path instead")
    parser.add_argument(
        "--all",
        action="store_true",
        help="one schema for every kind (oneOf on kind), for editors on files that mix kinds",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.common import print_json
    from kagura_agent.manifest.schema import KINDS, load_schema
    from kagura_agent.paths import resource_dir

    if args.all:
        from kagura_agent.manifest.bundle import bundle_schema

        print_json(bundle_schema())
        return 0
    if not args.kind:
        for kind in KINDS:
            print(f"{kind:<20} {resource_dir('schemas') / (kind.lower() + '.json')}")
        return 0
    matches = [k for k in KINDS if k.lower() == args.kind.lower()]
    if not matches:
        raise UsageError(f"unknown kind {args.kind!r}", hint="kinds: " + ", ".join(KINDS))
    if args.path:
        print(resource_dir("schemas") / f"{matches[0].lower()}.json")
    else:
        print_json(load_schema(matches[0]))
    return 0
