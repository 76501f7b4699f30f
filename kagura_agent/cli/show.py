"""kagura-agent show PLAN: render a saved plan."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    from kagura_agent.cli.plan import add_output_options

    parser = subparsers.add_parser("show", help="render a saved plan file")
    parser.add_argument("plan", metavar="PLAN", help="a plan saved with `plan -o`")
    add_output_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.common import print_json
    from kagura_agent.cli.plan import envelope, output_format, result_json
    from kagura_agent.plan import planfile
    from kagura_agent.plan.render import render_markdown, render_text
    from kagura_agent.ui import stdout_style

    plan = planfile.load(Path(args.plan))
    fmt = output_format(args)
    if fmt == "json":
        print_json(envelope([result_json(plan, None, [])]))
    elif fmt == "markdown":
        sys.stdout.write(render_markdown(plan))
    else:
        sys.stdout.write(render_text(plan, stdout_style()))
    return 0
