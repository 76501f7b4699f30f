"""kagura-agent serve: the cockpit — plan, approve and apply from chat or this terminal.

kagura-agent serve                       the Transport manifest (default: terminal)
kagura-agent serve --transport NAME      a named Transport manifest (cli, slack or discord)
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from kagura_agent.cli.common import add_manifest_option, seconds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="the cockpit: plan, approve and apply from chat or the terminal",
        description="Run the cockpit on a chat transport: its operators launch tasks,"
        " approve what plans need, follow and kill runs. Every run is `apply` of a plan"
        " the thread was shown.",
    )
    parser.add_argument("--transport", metavar="NAME", help="Transport manifest to serve on")
    parser.add_argument(
        "--approval-timeout",
        type=seconds(0, 7 * 86400),
        default=600.0,
        metavar="S",
        help="deny a request nobody answers within S seconds (600)",
    )
    parser.add_argument(
        "--project-root",
        metavar="DIR",
        help="project root of `run TEXT` tasks from chat (default: the current directory)",
    )
    parser.add_argument("--image", metavar="NAME", help="Image manifest for `run TEXT` tasks")
    team = parser.add_argument_group("team queue")
    team.add_argument(
        "--queue",
        action="store_true",
        help="team mode: an approved session is queued for the team's runners (as"
        " `apply --queue` does) instead of applied on this host; its events come back"
        " into the thread",
    )
    team.add_argument(
        "--queue-url",
        metavar="URL",
        help="the queue's PostgreSQL (default: $KAGURA_AGENT_QUEUE_URL, else"
        " $KAGURA_AGENT_STATE_URL); implies --queue",
    )
    add_manifest_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cockpit.core import Cockpit, CockpitConfig
    from kagura_agent.cockpit.operators import transport_operators
    from kagura_agent.manifest.workspace import load_workspace

    catalog = load_workspace(args.manifests, []).catalog
    found = transport_operators(catalog, args.transport)
    spec, operators = found.spec, set(found.ids)
    queue = None
    if args.queue or args.queue_url:
        from kagura_agent.team.db import ensure_schema, queue_url

        queue = queue_url(args.queue_url)
        ensure_schema(queue)  # unreachable or not PostgreSQL: said now, not at the first run
    transport = _transport(found.transport, spec)

    cockpit = Cockpit(
        transport,
        CockpitConfig(
            operators=frozenset(operators),
            manifests=args.manifests,
            approval_timeout=args.approval_timeout,
            project_root=Path(args.project_root) if args.project_root else None,
            image=args.image,
            # graduation proposals: the operators' channel (the terminal is its own)
            channel="tty" if spec["type"] == "cli" else spec.get("channel"),
            queue_url=queue,
        ),
    )
    for session in cockpit.settle_previous():
        print(f"serve: settled session {session.id} ({session.state} before)", file=sys.stderr)
    if spec["type"] != "cli":  # the terminal greets on stdout itself
        print(
            f"serve: {found.transport} ({spec['type']}) for {len(operators)} operator(s);"
            " Ctrl-C stops (running applies are interrupted and clean up)",
            file=sys.stderr,
        )
    stop = lambda _signum, _frame: transport.stop()  # noqa: E731
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    cockpit.serve()
    return 0


def _transport(name: str, spec: dict[str, Any]) -> Any:
    from kagura_agent.errors import UsageError

    kind = spec["type"]
    if kind == "cli":
        from kagura_agent.approvals import operator_name
        from kagura_agent.cockpit.terminal import TerminalTransport

        return TerminalTransport(operator_name())
    if kind == "slack":
        from kagura_agent.cockpit.slack import SlackTransport
        from kagura_agent.membrane.secrets import resolve

        for key in ("token", "app_token"):
            if not spec.get(key):
                raise UsageError(f"Transport {name} (slack) needs spec.{key}")
        return SlackTransport(
            resolve(spec["token"]), resolve(spec["app_token"]), base_url=spec.get("base_url")
        )
    if kind == "discord":
        from kagura_agent.cockpit.discord import DiscordTransport
        from kagura_agent.membrane.secrets import resolve

        if not spec.get("token"):
            raise UsageError(f"Transport {name} (discord) needs spec.token")
        return DiscordTransport(resolve(spec["token"]), base_url=spec.get("base_url"))
    raise UsageError(f"Transport {name}: unknown transport type {kind!r}")
