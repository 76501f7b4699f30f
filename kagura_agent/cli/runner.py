"""kagura-agent runner: apply the team's queued plans on this Docker host."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

from kagura_agent.cli.common import count, seconds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "runner", help="take queued, approved plans from the team queue and apply them here"
    )
    parser.add_argument(
        "--name", default=socket.gethostname(), help="this runner's identity (default: hostname)"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="this runner's own state directory (default: $KAGURA_AGENT_STATE_DIR or the"
        " user's state directory)",
    )
    parser.add_argument(
        "--concurrency", type=count(1, 64), default=2, metavar="N", help="runs at once (default 2)"
    )
    parser.add_argument(
        "--runtime",
        action="append",
        default=[],
        metavar="NAME",
        help="an OCI runtime this host offers (repeatable; runc, runsc, kata; default runc);"
        " checked against the Docker daemon",
    )
    parser.add_argument(
        "--tenancy",
        action="append",
        default=[],
        choices=["self-host", "shared"],
        help="whose plans this host takes (repeatable; default self-host); shared needs"
        " a runsc or kata runtime",
    )
    parser.add_argument(
        "--heartbeat",
        type=seconds(0.01, 3600),
        default=10.0,
        metavar="S",
        help="seconds between heartbeats",
    )
    parser.add_argument(
        "--stalled-after",
        type=seconds(0.01, 86400),
        default=30.0,
        metavar="S",
        help="a runner silent this long is gone: its runs are marked lost (default 30)",
    )
    parser.add_argument("--queue-url", metavar="URL", help="the queue's PostgreSQL")
    parser.add_argument(
        "--manifests",
        metavar="DIR",
        help="the operator folder whose State manifest names the team's database, for this"
        " runner and its applies (default: $KAGURA_AGENT_MANIFESTS, ./manifests)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.errors import UsageError
    from kagura_agent.paths import state_dir
    from kagura_agent.team.db import queue_url
    from kagura_agent.team.placement import capacity
    from kagura_agent.team.runner import RunnerConfig, daemon_runtimes, serve

    if args.stalled_after <= 2 * args.heartbeat:
        raise UsageError("--stalled-after must be more than twice --heartbeat")
    url = queue_url(args.queue_url)
    config = RunnerConfig(
        name=args.name,
        state_dir=(args.state_dir or state_dir()).resolve(),
        capacity=capacity(args.concurrency, args.runtime, args.tenancy, daemon_runtimes()),
        heartbeat=args.heartbeat,
        stalled_after=args.stalled_after,
    )
    return serve(url, config)
