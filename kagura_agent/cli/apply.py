"""kagura-agent apply TASK|PLAN: run exactly the plan that was shown."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kagura_agent.cli.common import add_manifest_option
from kagura_agent.plan.model import Plan


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("apply", help="execute a task's plan (or a saved plan)")
    parser.add_argument("target", metavar="TASK|PLAN", help="a task file, or a plan saved with -o")
    add_manifest_option(parser)
    add_apply_options(parser)
    parser.add_argument(
        "--approvals-since",
        metavar="ISO",
        type=_iso_time,
        help="also accept approvals recorded for this exact plan since ISO (UTC) — how the"
        " serve cockpit hands over what its operators approved in chat",
    )
    parser.set_defaults(handler=run)


def _iso_time(text: str) -> Any:
    from datetime import UTC

    from kagura_agent.clock import parse_iso

    try:
        moment = parse_iso(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def add_apply_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    parser.add_argument(
        "--approve",
        action="append",
        default=[],
        metavar="CAP",
        help="approve a needs-approval capability category (repeatable)",
    )
    parser.add_argument(
        "--allow-host-runtime",
        action="store_true",
        help="allow a plan whose brain runs on the host, unsandboxed",
    )
    parser.add_argument(
        "--approval-timeout", type=float, default=120.0, metavar="S", help="deny after S seconds"
    )
    parser.add_argument("--json", action="store_true", help="events as JSON lines; result as JSON")


def run(args: argparse.Namespace) -> int:
    from kagura_agent.plan import planfile

    target = Path(args.target)
    if target.suffix == ".json":
        plan = planfile.load(target)
        check_saved_plan_fresh(plan)
        return execute(plan, args, confirm=False)
    from kagura_agent.errors import UsageError
    from kagura_agent.plan.build import plan_tasks

    plans = plan_tasks(args.manifests, [str(target)])
    if len(plans) != 1:
        raise UsageError(f"{target} holds {len(plans)} tasks; apply one task at a time")
    return execute(plans[0], args, confirm=not args.yes)


def _planned_from(task: Mapping[str, Any]) -> str:
    """The working directory ``plan`` ran in: the task's absolute path minus its shown name."""
    path, shown = str(task.get("path") or ""), str(task.get("file") or "")
    if shown and not shown.startswith("/") and path.endswith("/" + shown):
        folder = path[: -len(shown) - 1] or "/"
        if Path(folder).is_dir():
            return folder
    return os.getcwd()


def check_saved_plan_fresh(plan: Plan) -> None:
    from kagura_agent.apply.freshness import check_fresh
    from kagura_agent.errors import RefusedError
    from kagura_agent.plan.build import plan_tasks

    inputs = plan["inputs"]
    manifests = inputs.get("manifests_dir", "")
    task_path = plan["task"].get("path")
    if "@" in manifests or not task_path or not Path(task_path).exists():
        raise RefusedError(
            "saved plan is stale: its task file or manifest directory is gone",
            hint="make a new plan",
        )
    # Input files are named relative to the folder the plan was made in; re-plan from
    # there, so a plan applied from another working directory is not called stale.
    with contextlib.chdir(_planned_from(plan["task"])):
        current = [
            p
            for p in plan_tasks(manifests, [task_path])
            if p["task"]["name"] == plan["task"]["name"]
        ]
    if not current:
        raise RefusedError(f"saved plan is stale: task {plan['task']['name']} no longer exists")
    check_fresh(plan, current[0])


def execute(plan: Plan, args: argparse.Namespace, *, confirm: bool) -> int:
    from kagura_agent.apply.executor import ApplyOptions, apply_plan
    from kagura_agent.cli.common import print_json
    from kagura_agent.errors import RefusedError
    from kagura_agent.plan.render import render_text
    from kagura_agent.ui import Style

    interactive = sys.stdin.isatty()
    if not args.json:
        sys.stderr.write(render_text(plan, Style.for_stream(sys.stderr)))
    if confirm:
        if not interactive:
            raise RefusedError("not confirmed: stdin is not a terminal", hint="pass --yes")
        answer = input("Apply this plan? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise RefusedError("not confirmed")
    options = ApplyOptions(
        approve=tuple(args.approve),
        allow_host_runtime=args.allow_host_runtime,
        interactive=interactive,
        approval_timeout=args.approval_timeout,
        as_json=args.json,
        prompt=getattr(args, "follow_up", None),
        accept_since=getattr(args, "approvals_since", None),
    )
    result = apply_plan(plan, options)
    if args.json:
        try:
            print_json({"ok": result.exit_code == 0, "errors": [], **result.to_json()})
        except BrokenPipeError:
            # The reader is gone; the outcome is in the state store. Keep the exit code
            # the run's, and let the interpreter's final flush find somewhere to write.
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return result.exit_code
