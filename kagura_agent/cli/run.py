"""kagura-agent run "task" | --prompt-file F | -  (and repl): a task from the defaults.

They write a Task document for the current directory and go through the same
plan → show → apply path as ``apply``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from kagura_agent.cli.apply import add_apply_options, apply_options, execute
from kagura_agent.cli.common import add_manifest_option
from kagura_agent.errors import UsageError
from kagura_agent.inputfile import decode, read_text
from kagura_agent.manifest.loader import MAX_FILE_BYTES


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help='run a one-off task: run "text", --prompt-file F, or -'
    )
    parser.add_argument("text", nargs="?", help='the task text, or "-" to read it from stdin')
    parser.add_argument("--prompt-file", metavar="FILE", help="read the task text from a file")
    parser.add_argument("--session", metavar="NAME", help="a named, resumable session")
    parser.add_argument(
        "--brain", metavar="NAME", help="brain manifest (default: the first LLM brain)"
    )
    parser.add_argument(
        "--egress", action="append", default=[], metavar="POLICY", help="egress policy"
    )
    parser.add_argument("--image", metavar="NAME", help="image manifest (default: the default one)")
    parser.add_argument(
        "--tool-server",
        action="append",
        default=[],
        metavar="NAME",
        dest="tool_servers",
        help="a ToolServer the agent may use (sdk brain only)",
    )
    add_manifest_option(parser)
    add_apply_options(parser)
    parser.set_defaults(handler=run)

    repl = subparsers.add_parser("repl", help="interactive: each line continues the same session")
    repl.add_argument("--session", metavar="NAME", help="session name (default: a new one)")
    repl.add_argument("--brain", metavar="NAME", help="brain manifest")
    repl.add_argument("--egress", action="append", default=[], metavar="POLICY")
    repl.add_argument("--image", metavar="NAME", help="image manifest")
    repl.add_argument(
        "--tool-server", action="append", default=[], metavar="NAME", dest="tool_servers"
    )
    add_manifest_option(repl)
    add_apply_options(repl)
    repl.set_defaults(handler=run_repl)


def task_text(args: argparse.Namespace) -> str:
    if args.prompt_file and args.text:
        raise UsageError("give the task inline or with --prompt-file, not both")
    if args.prompt_file:
        text = read_text(args.prompt_file, MAX_FILE_BYTES)
    elif args.text == "-":
        data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise UsageError(
                f"the task on standard input is more than {MAX_FILE_BYTES // 1024} KiB"
            )
        text = decode(data, "standard input")
    elif args.text:
        text = args.text
    else:
        raise UsageError('no task given: run "text", run --prompt-file F, or run -')
    if not text.strip():
        raise UsageError("task must not be empty")
    return text


def write_task(text: str, args: argparse.Namespace, session: str | None) -> Path:
    """Unpack ``--brain``/``--image``/``--egress``/``--tool-server``/``--manifests`` into
    the one-off task."""
    from kagura_agent.manifest.adhoc import AdhocTask, write_adhoc_task

    task = AdhocTask(
        text,
        brain=args.brain,
        image=args.image,
        egress=args.egress,
        session=session,
        tool_servers=args.tool_servers,
    )
    return write_adhoc_task(task, manifests=args.manifests)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.plan.build import compile_tasks

    path = write_task(task_text(args), args, args.session)
    compiled = compile_tasks(args.manifests, [str(path)])[0]
    options = apply_options(args)
    options.compiled = compiled
    return execute(compiled.plan, options, confirm=not args.yes)


def run_repl(args: argparse.Namespace) -> int:
    """Each line is a new one-off task of the same named session (the brain resumes it)."""
    from kagura_agent.plan.build import compile_tasks

    session = args.session or f"repl-{int(time.time())}"
    print(f"session {session}: one line per turn; Ctrl-D ends", file=sys.stderr)
    code = 0
    while True:
        try:
            line = input("kagura> ")
        except EOFError:
            print(file=sys.stderr)
            return code
        if not line.strip():
            continue
        path = write_task(line, args, session)
        compiled = compile_tasks(args.manifests, [str(path)])[0]
        options = apply_options(args)
        options.compiled = compiled
        code = execute(compiled.plan, options, confirm=False)
