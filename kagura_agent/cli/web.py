"""``kagura-agent web``: the console for runs — timelines, costs, egress, graduation, the
team queue and incidents — in a browser, over the state store every command uses.

kagura-agent web [--port N] [--bind ADDR]          read-only, on 127.0.0.1:8765
kagura-agent web --allow-approvals [--operator ID]  answer mid-run questions too
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kagura_agent.cli.common import add_manifest_option, count

DEFAULT_PORT = 8765


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "web",
        help="a console for runs in the browser (read-only unless --allow-approvals)",
        description="Serve a console over the state store: runs and their timelines (live"
        " while they run), cost against the forecast, egress decisions, graduation, the team"
        " queue, incidents and approvals. Binds 127.0.0.1; the first line printed is the URL"
        " to open, with a one-time login token.",
    )
    parser.add_argument(
        "--port", type=count(0, 65535), default=DEFAULT_PORT, help="port (8765; 0: any free one)"
    )
    parser.add_argument(
        "--bind", metavar="ADDR", default="127.0.0.1", help="address to listen on (127.0.0.1)"
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    parser.add_argument(
        "--insecure-bind",
        action="store_true",
        help="allow a non-loopback --bind without TLS (the token and cookie travel in clear)",
    )
    parser.add_argument(
        "--allow-approvals",
        action="store_true",
        help="answer running runs' questions here (recorded as web:OPERATOR in the approval"
        " log, like an answer in chat)",
    )
    parser.add_argument(
        "--transport",
        metavar="NAME",
        help="the Transport whose operators may approve (default: the default Transport)",
    )
    parser.add_argument(
        "--operator",
        metavar="ID",
        help="who answers: one of the Transport's operators (default: your user name)",
    )
    add_manifest_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.clock import SystemClock
    from kagura_agent.cockpit.operators import transport_operators
    from kagura_agent.errors import SetupError, UsageError
    from kagura_agent.graduation.settings import graduation_settings
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.state import state_location

    try:
        from kagura_agent.web.app import ConsoleConfig
        from kagura_agent.web.serve import Binding, check_binding, serve
    except ImportError as exc:
        raise SetupError(
            f"the web console needs starlette and uvicorn ({exc.name} is missing)",
            hint="pip install 'kagura-agent[web]'",
        ) from exc

    binding = Binding(
        address=args.bind,
        port=args.port,
        cert=Path(args.tls_cert) if args.tls_cert else None,
        key=Path(args.tls_key) if args.tls_key else None,
        insecure=args.insecure_bind,
    )
    check_binding(binding)
    if (args.operator or args.transport) and not args.allow_approvals:
        raise UsageError("--operator and --transport choose who approves: add --allow-approvals")
    catalog = load_workspace(args.manifests, []).catalog
    approver, operators = None, frozenset[str]()
    if args.allow_approvals:
        from kagura_agent.approvals import operator_name

        found = transport_operators(catalog, args.transport)
        who = args.operator or operator_name()
        if who not in found.ids:
            raise UsageError(
                f"{who!r} is not an operator of Transport {found.transport}"
                f" (operators: {', '.join(sorted(found.ids))})",
                hint="pass --operator ID with one of them, or add yours to spec.operators",
            )
        approver, operators = f"web:{who}", found.ids
    config = ConsoleConfig(
        location=state_location(),
        knobs=graduation_settings(catalog).knobs,
        clock=SystemClock(),
        approver=approver,
        operators=operators,
    )
    return serve(binding, config)
