"""kagura-agent run "task" | --prompt-file F | -  (and repl): a task from the defaults.

They write a Task document for the current directory and go through the same
plan → show → apply path as ``apply``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kagura_agent.cli.apply import add_apply_options
from kagura_agent.cli.common import add_manifest_option
from kagura_agent.errors import UsageError

if TYPE_CHECKING:
    from kagura_agent.manifest.catalog import Catalog


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
    add_manifest_option(parser)
    add_apply_options(parser)
    parser.set_defaults(handler=run)

    repl = subparsers.add_parser("repl", help="interactive: each line continues the same session")
    repl.add_argument("--session", metavar="NAME", help="session name (default: a new one)")
    repl.add_argument("--brain", metavar="NAME", help="brain manifest")
    repl.add_argument("--egress", action="append", default=[], metavar="POLICY")
    repl.add_argument("--image", metavar="NAME", help="image manifest")
    add_manifest_option(repl)
    add_apply_options(repl)
    repl.set_defaults(handler=run_repl)


def task_text(args: argparse.Namespace) -> str:
    if args.prompt_file and args.text:
        raise UsageError("give the task inline or with --prompt-file, not both")
    if args.prompt_file:
        try:
            text = Path(args.prompt_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {args.prompt_file}: {exc.strerror}") from exc
    elif args.text == "-":
        text = sys.stdin.read()
    elif args.text:
        text = args.text
    else:
        raise UsageError('no task given: run "text", run --prompt-file F, or run -')
    if not text.strip():
        raise UsageError("task must not be empty")
    return text


def write_task(
    text: str, args: argparse.Namespace, session: str | None, project_root: Path | None = None
) -> Path:
    """The one-off task as a Task document in the state directory (kept for review).

    ``args`` carries ``brain``, ``egress``, ``image`` and ``manifests``; the project root is
    ``project_root``, by default the current directory.
    """
    import yaml

    from kagura_agent.paths import state_dir

    brain = _check_names(args)
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:40].strip("-") or "task"
    spec: dict[str, Any] = {
        "brain": brain,
        # The text is a value, never template source: nothing in it is interpreted.
        "prompt": "{{ text }}",
        "vars": {"text": text},
        "project_root": str((project_root or Path.cwd()).resolve()),
        "kind": "adhoc",
    }
    if session:
        spec["session"] = session
    if args.egress:
        spec["egress"] = list(args.egress)
    if args.image:
        spec["image"] = args.image
    document = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": f"run-{name}"[:63].rstrip("-")},
        "spec": spec,
    }
    folder = state_dir() / "adhoc"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{int(time.time() * 1000)}.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _check_names(args: argparse.Namespace) -> str:
    """The brain to use, after checking every name given on the command line.

    A wrong ``--brain``/``--image``/``--egress`` is the user's flag, so the error names
    the flag, not the task file generated from it (which is then never written).
    """
    from kagura_agent.manifest.workspace import load_workspace

    catalog = load_workspace(args.manifests, []).catalog
    given = [("--brain", "Brain", args.brain), ("--image", "Image", args.image)]
    given += [("--egress", "EgressPolicy", name) for name in args.egress or ()]
    for flag, kind, name in given:
        if name and catalog.get(kind, name) is None:
            known = ", ".join(catalog.names(kind)) or "(none)"
            raise UsageError(f"{flag} {name}: no {kind} of that name", hint=f"known: {known}")
    return str(args.brain) if args.brain else _llm_brain(catalog)


def _llm_brain(catalog: Catalog) -> str:
    default = catalog.default("Brain")
    if default is not None and default.spec["engine"] != "script":
        return default.name
    for brain in catalog.of("Brain"):
        if brain.spec["engine"] != "script":
            return brain.name
    raise UsageError(
        "no LLM brain in the manifests", hint="add a Brain with engine sdk or kagura-brain"
    )


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.apply import execute
    from kagura_agent.plan.build import plan_tasks

    path = write_task(task_text(args), args, args.session)
    plan = plan_tasks(args.manifests, [str(path)])[0]
    return execute(plan, args, confirm=not args.yes)


def run_repl(args: argparse.Namespace) -> int:
    from kagura_agent.cli.apply import execute
    from kagura_agent.plan.build import plan_tasks

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
        plan = plan_tasks(args.manifests, [str(path)])[0]
        code = execute(plan, args, confirm=False)
