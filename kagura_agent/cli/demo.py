"""``kagura-agent demo``: watch the real agent loop in the membrane, without a key."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="watch a real agent run (the bundled Claude Code CLI) against a scripted"
        " demo endpoint: no key needed",
        description="Makes a throwaway project, plans and shows the plan, then applies it"
        " through the membrane with the real Claude Code CLI, whose model is a scripted"
        " endpoint the demo starts (it says so in every answer; no key, nothing leaves the"
        " machine). The agent edits files, asks for access mid-run and is steered by a"
        " message; everything the demo started is removed at the end, or on Ctrl-C.",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="answer the mid-run question yes and send the demo's own steering message,"
        " saying so (no terminal needed)",
    )
    parser.add_argument(
        "--image",
        metavar="REF",
        help="the agent image with the bundled CLI (default: the built kagura/agent)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="stop the demo after this long (default 300; 30 to 1800)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the demo's folder (project, manifests, state) and say where it is",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.demo.show import DemoOptions, run_demo
    from kagura_agent.errors import UsageError

    if not 30 <= args.timeout <= 1800:
        raise UsageError("--timeout must be 30 to 1800 seconds")
    return run_demo(
        DemoOptions(yes=args.yes, image=args.image, timeout=args.timeout, keep=args.keep)
    )
