"""kagura-agent queue list|follow|cancel|runners: the team queue's runs, as the shared
store has them."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from kagura_agent.cli.common import seconds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("queue", help="queued runs of the team's runners")
    parser.add_argument("--queue-url", metavar="URL", help="the queue's PostgreSQL")
    actions = parser.add_subparsers(dest="queue_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the latest queued runs and their status")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=run_list)
    follow = actions.add_parser("follow", help="stream one run's events until it ends")
    follow.add_argument("run_id", metavar="RUN")
    follow.add_argument("--json", action="store_true", help="events as JSON lines")
    follow.add_argument(
        "--timeout", type=seconds(0, 30 * 86400), metavar="S", help="give up after S seconds"
    )
    follow.set_defaults(handler=run_follow)
    cancel = actions.add_parser(
        "cancel",
        help="stop a run: cancelled in the queue before a runner takes it, else its runner"
        " interrupts the apply (leases revoked, containers removed)",
    )
    cancel.add_argument("run_id", metavar="RUN")
    cancel.add_argument("--json", action="store_true")
    cancel.set_defaults(handler=run_cancel)
    runners = actions.add_parser("runners", help="runners that registered, with capacity")
    runners.add_argument("--json", action="store_true")
    runners.set_defaults(handler=run_runners)


def run_list(args: argparse.Namespace) -> int:
    from kagura_agent.cli.common import print_json
    from kagura_agent.team.db import queue_url
    from kagura_agent.team.queue import runs

    rows = runs(queue_url(args.queue_url))
    if args.json:
        print_json({"ok": True, "errors": [], "runs": rows})
        return 0
    for row in rows:
        where = f" on {row['runner']}" if row["runner"] else ""
        tail = f"  {row['message']}" if row["message"] else ""
        print(f"{row['run_id']}  {row['status']:<8} {row['task']}{where}{tail}")
    return 0


def run_follow(args: argparse.Namespace) -> int:
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.membrane.secrets import Redactor
    from kagura_agent.team.db import queue_url
    from kagura_agent.team.queue import follow

    last: dict[str, Any] = {}
    # The run's events shown as apply shows its own (tool calls with their commands, a
    # step's output line by line, egress decisions in words), timed from its first.
    view = LiveView(Redactor(), stream=sys.stdout)
    first: datetime | None = None
    for item in follow(queue_url(args.queue_url), args.run_id, timeout=args.timeout):
        last = item
        if args.json:
            print(json.dumps(item, default=str), flush=True)
            continue
        at = _at(item)
        first = first or at
        elapsed = (at - first).total_seconds() if at and first else None
        if not view.replay(item, elapsed):
            print(_line(item), flush=True)
    status = last.get("status")
    code = last.get("exit_code")
    if status in ("lost", "cancelled"):
        return 1
    return int(code) if isinstance(code, int) and code >= 0 else 0


def run_cancel(args: argparse.Namespace) -> int:
    from kagura_agent.approvals.asking import operator_name
    from kagura_agent.cli.common import print_json
    from kagura_agent.team.db import queue_url
    from kagura_agent.team.queue import cancel, run

    url = queue_url(args.queue_url)
    said = cancel(url, args.run_id, operator_name())
    if args.json:
        status = run(url, args.run_id)["status"]
        print_json(
            {"ok": True, "errors": [], "run": args.run_id, "status": status, "message": said}
        )
    else:
        print(said)
    return 0


def _at(item: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(item.get("at")))
    except ValueError:
        return None


def _line(item: dict[str, Any]) -> str:
    """The queue's own items (and any apply does not show): one line each, in words."""
    from kagura_agent.hygiene import neutralise

    kind = item.get("kind", "")
    if kind == "status":
        why = f" ({item['message']})" if item.get("message") else ""
        line = f"run {item['run_id']}: {item['status']}{why}"
    elif kind == "end":
        code = item.get("exit_code")
        said = f": {item['message']}" if item.get("message") else ""
        line = f"  ended {item.get('status', '')} (exit {code}){said}"
    elif item.get("message"):
        line = f"  {kind}: {item['message']}"
    else:
        shown = {k: v for k, v in item.items() if k not in ("kind", "at")}
        line = f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in shown.items())
    return neutralise(line, newlines=False)


def run_runners(args: argparse.Namespace) -> int:
    from kagura_agent.cli.common import print_json
    from kagura_agent.team.db import connect, ensure_schema, queue_url

    url = queue_url(args.queue_url)
    ensure_schema(url)
    with connect(url) as conn:
        rows = conn.execute("SELECT * FROM kagura_team_runners ORDER BY name").fetchall()
    items = [
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows
    ]
    if args.json:
        print_json({"ok": True, "errors": [], "runners": items})
        return 0
    for item in items:
        sys.stdout.write(
            f"{item['name']}  {item['concurrency']} at once  {', '.join(item['queues'])}"
            f"  ({item['host']}, pid {item['pid']})\n"
        )
    return 0
