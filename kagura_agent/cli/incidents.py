"""``kagura-agent incidents``: runs a hijack tripwire stopped, newest first."""

from __future__ import annotations

import argparse
from typing import Any

from kagura_agent.cli.common import count, print_ok


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "incidents",
        help="list runs a hijack tripwire stopped",
        description="Runs a tripwire stopped: why, what was done, the egress decisions and"
        " the run's last brain events.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--limit",
        type=count(1, 1000),
        default=20,
        help="at most this many (newest first, max 1000)",
    )
    parser.set_defaults(handler=_list)


def _list(args: argparse.Namespace) -> int:
    from kagura_agent.apply.records.incidents import list_incidents
    from kagura_agent.errors import UsageError
    from kagura_agent.hygiene import neutralise
    from kagura_agent.state import open_store

    if not 1 <= args.limit <= 1000:
        raise UsageError("--limit must be 1..1000")
    with open_store() as store:
        incidents = list_incidents(store, args.limit)
    if args.json:
        print_ok({"incidents": incidents})
        return 0
    if not incidents:
        print("no incidents recorded")
        return 0
    for item in incidents:
        denied = [e for e in item["egress"] if e.get("decision") == "deny"]
        print(
            f"{item['id']}  {item['at']}  run {item['run_id']}  task {neutralise(item['task'], newlines=False)}"
        )
        print(f"  reason   {neutralise(item['reason'], newlines=False)}")
        print(f"  actions  {'; '.join(item['actions'])}")
        for event in denied[:10]:
            where = f"{event.get('host')}:{event.get('port')}"
            print(f"  denied   {neutralise(where, newlines=False)}")
        if len(denied) > 10:
            print(f"  denied   … {len(denied) - 10} more (--json)")
        print(f"  events   {len(item['events'])} (--json)")
    return 0
