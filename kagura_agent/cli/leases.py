"""``kagura-agent leases``: list the lease ledger, revoke one lease, sweep orphans."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kagura_agent.cli.common import print_ok
from kagura_agent.membrane.providers.traits import release_says


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "leases",
        help="list, revoke and sweep leased credentials",
        description="The durable lease ledger: what was minted, for which run, and its state.",
    )
    commands = parser.add_subparsers(dest="leases_command", metavar="SUBCOMMAND")

    listing = commands.add_parser(
        "list",
        help="show leases: open ones and released ones that still work until they lapse"
        " (or --all); ENDS says how each kind of credential ends",
    )
    listing.add_argument("--all", action="store_true", help="include closed leases")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=_list)

    revoke = commands.add_parser("revoke", help="revoke one lease now (a grant or lease id)")
    revoke.add_argument("id")
    revoke.add_argument(
        "--acknowledge",
        action="store_true",
        help="close a poison row after you revoked it by hand at the provider",
    )
    revoke.set_defaults(handler=_revoke)

    sweep = commands.add_parser("sweep", help="revoke leases whose run is gone")
    sweep.add_argument("--json", action="store_true")
    sweep.set_defaults(handler=_sweep)

    parser.set_defaults(handler=lambda args: _help(parser))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _list(args: argparse.Namespace) -> int:
    from kagura_agent.clock import SystemClock
    from kagura_agent.membrane.leases.ledger import Ledger
    from kagura_agent.state import open_store

    with open_store() as store:
        rows = Ledger(store, SystemClock()).rows(include_closed=args.all)
    if args.json:
        print_ok({"leases": [row.to_json() for row in rows]})
        return 0
    if not rows:
        print("no open leases" if not args.all else "no leases recorded")
        return 0
    print(
        f"{'ID':<16} {'STATE':<9} {'CREDENTIAL':<34} {'CLASS':<14} {'EXPIRES':<21}"
        f" {'ENDS':<12} NOTE"
    )
    for row in rows:
        item = row.to_json()
        credential = f"{row.name} ({row.provider}/{row.scope})"
        note = row.last_error or row.note or ""
        print(
            f"{row.id:<16} {row.state:<9} {credential:<34} {row.klass:<14}"
            f" {item['expires_at'] or '-':<21} {ENDS.get(row.release, row.release):<12} {note}"
        )
    for release in sorted({row.release for row in rows}):
        print(f"  {ENDS.get(release, release)}: {release_says(release)}")
    return 0


# How each kind of credential ends, in the ENDS column (the provider type's traits).
ENDS = {
    "revoked": "revoked",
    "revoked-live": "revoked*",  # revoked at release; lapses after a crash
    "lapses": "lapses",
    "standing": "standing",
}


def _revoke(args: argparse.Namespace) -> int:
    from kagura_agent.clock import SystemClock
    from kagura_agent.errors import RefusedError, UsageError
    from kagura_agent.membrane.leases.ledger import Ledger
    from kagura_agent.membrane.leases.sweeper import Sweeper
    from kagura_agent.state import open_store

    with open_store() as store:
        ledger = Ledger(store, SystemClock())
        targets = [r for r in ledger.open_rows() if args.id in (r.id, r.lease)]
        if not targets:
            raise UsageError(f"no open lease {args.id!r}", hint="kagura-agent leases list")
        if args.acknowledge:
            for row in targets:
                ledger.close(row.id, "revoked", note="acknowledged by operator")
            print(f"closed {len(targets)} row(s) as revoked by the operator")
            return 0
        report = Sweeper(store).sweep(only=args.id, force=True)
        print(report.summary())
        if report.poison or report.retry_later:
            raise RefusedError(
                f"lease {args.id} could not be revoked; see `kagura-agent leases list`",
                hint="fix the provider access, retry, or --acknowledge after revoking by hand",
            )
        return 0


def _sweep(args: argparse.Namespace) -> int:
    from kagura_agent.membrane.leases.sweeper import Sweeper
    from kagura_agent.state import open_store

    with open_store() as store:
        report = Sweeper(store).sweep()
    if args.json:
        print_ok({"sweep": report.__dict__})
    else:
        print(report.summary())
    return 0
