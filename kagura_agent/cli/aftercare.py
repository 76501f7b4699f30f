"""``kagura-agent aftercare ROOT``: check a quarantined project root again and lift it."""

from __future__ import annotations

import argparse
from typing import Any

from kagura_agent.cli.common import print_ok


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "aftercare",
        help="check a quarantined project root again and lift the quarantine",
        description="A run's aftercare (clearing setuid/setgid bits, write for others and"
        " ACL entries granting others in its project root) that could not check every"
        " entry quarantines the root: no other user can enter it, and apply refuses it."
        " This walks the root again from that run's start, with no bound on entries or"
        " time; when it reaches every entry it gives the root back its mode and ACL.",
    )
    parser.add_argument("root", metavar="ROOT", help="the quarantined project root")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_aftercare)


def _aftercare(args: argparse.Namespace) -> int:
    from kagura_agent.apply.aftercare.root import check_again
    from kagura_agent.hygiene import neutralise
    from kagura_agent.state import open_store

    with open_store() as store:
        report, mode = check_again(store, args.root)
    if args.json:
        print_ok(
            {
                "lifted": True,
                "scanned": report.scanned,
                "cleared": report.cleared.count,
                "world_writable": report.world_writable.count,
                "acl_removed": report.acl_removed.count,
                "mode": None if mode is None else f"{mode:04o}",
            }
        )
        return 0
    for line in report.summary():
        print(line)
    given = "" if mode is None else f", mode {mode:04o} given back"
    print(
        f"checked {report.scanned} entries of {neutralise(args.root, newlines=False)}:"
        f" quarantine lifted{given}"
    )
    return 0
