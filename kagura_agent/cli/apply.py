"""kagura-agent apply TASK|PLAN: run exactly the plan that was shown."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kagura_agent.cli.common import add_manifest_option, seconds
from kagura_agent.plan.model import Plan

if TYPE_CHECKING:
    from kagura_agent.apply.run.executor import ApplyOptions


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
    parser.add_argument(
        "--steer-stdin",
        action="store_true",
        help="read messages for the running brain on stdin, one JSON object a line"
        ' ({"text": ...}): each reaches it as the next user message where its engine takes'
        " one — how the serve cockpit relays a thread reply",
    )
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="the run's id, chosen by the caller (a team runner passes the queued run's id)",
    )
    team = parser.add_argument_group("team queue")
    team.add_argument(
        "--queue",
        action="store_true",
        help="do not apply here: queue this saved, approved plan for the team's runners"
        " (prints the run id to follow with `kagura-agent queue follow`)",
    )
    team.add_argument(
        "--queue-url",
        metavar="URL",
        help="the queue's PostgreSQL (default: $KAGURA_AGENT_QUEUE_URL, else"
        " $KAGURA_AGENT_STATE_URL)",
    )
    team.add_argument(
        "--approval-ttl",
        type=seconds(0.01, 30 * 86400),
        default=3600.0,
        metavar="S",
        help="the approval given with the queued plan lapses after S seconds; a runner that"
        " takes the run later refuses it (default 3600)",
    )
    # Everything apply opened is closed when it returns: no interpreter teardown after it.
    parser.set_defaults(handler=run, fast_exit=True)


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
        "--approval-timeout",
        type=seconds(0, 7 * 86400),
        default=120.0,
        metavar="S",
        help="deny after S seconds",
    )
    parser.add_argument(
        "--answer-floor",
        type=seconds(1, 86400),
        default=30.0,
        metavar="S",
        help="ask a mid-run budget question at least S seconds before the budget ends, so"
        " an operator has that long to answer (default 30; capped by the budget)",
    )
    parser.add_argument("--json", action="store_true", help="events as JSON lines; result as JSON")


def run(args: argparse.Namespace) -> int:
    from kagura_agent.apply.guards.parentdeath import stop_with_parent, take_back_sigint
    from kagura_agent.apply.run.executor import refuse_unapplyable
    from kagura_agent.apply.run.freshness import localize, refuse_agent_written
    from kagura_agent.plan import planfile

    take_back_sigint()  # started with SIGINT ignored (nohup, a background job): stoppable
    stop_with_parent()  # a dispatched child: SIGINT when its parent run dies
    target = Path(args.target)
    if args.queue:
        return queue(args, target)
    if target.suffix == ".json":
        saved = planfile.load(target)
        options = apply_options(args, accept_since=args.approvals_since)
        refuse_agent_written(target, saved)
        # The plan as written, before anything is pulled or re-planned for it.
        refuse_unapplyable(saved, options)
        local = localize(saved, log=_say)
        for change in local.changes:
            _say(f"differs on this host (no capability changes): {change.render()}")
        # The fresh compile is what a mid-run amendment starts from.
        options.compiled = local.compiled
        options.steer_stdin = args.steer_stdin
        options.run_id = args.run_id
        return execute(local.plan, options, confirm=False)
    from kagura_agent.errors import UsageError
    from kagura_agent.plan.build import compile_tasks

    compiled = compile_tasks(args.manifests, [str(target)])
    if len(compiled) != 1:
        raise UsageError(f"{target} holds {len(compiled)} tasks; apply one task at a time")
    options = apply_options(args, accept_since=args.approvals_since)
    options.compiled = compiled[0]
    options.steer_stdin = args.steer_stdin
    return execute(compiled[0].plan, options, confirm=not args.yes)


def queue(args: argparse.Namespace, target: Path) -> int:
    """``apply --queue PLAN.json``: check the saved plan is fresh, then queue it."""
    from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
    from kagura_agent.apply.run.freshness import check_saved_plan_fresh, refuse_agent_written
    from kagura_agent.approvals.asking import operator_name
    from kagura_agent.cli.common import print_json
    from kagura_agent.errors import UsageError
    from kagura_agent.plan import planfile
    from kagura_agent.team.db import queue_url
    from kagura_agent.team.queue import enqueue_plan

    if target.suffix != ".json":
        raise UsageError(
            "--queue takes a saved plan (plan -o PLAN.json), the plan the operator reviewed",
            hint=f"kagura-agent plan {target} -o plan.json, then apply --queue plan.json",
        )
    plan = planfile.load(target)
    refuse_agent_written(target, plan)
    refuse_unapplyable(plan, ApplyOptions(approve=tuple(args.approve)))
    check_saved_plan_fresh(plan)
    queued = enqueue_plan(
        queue_url(args.queue_url),
        plan,
        approve=args.approve,
        approval_ttl=args.approval_ttl,
        who=operator_name(),
    )
    if args.json:
        print_json({"ok": True, "errors": [], **queued.to_json()})
    else:
        print(f"queued {queued.run_id} on {queued.queue} (job {queued.job_id})")
        print(f"  follow it: kagura-agent queue follow {queued.run_id}")
    return 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def apply_options(
    args: argparse.Namespace, *, accept_since: datetime | None = None
) -> ApplyOptions:
    """The apply options every applying command shares (``add_apply_options``), unpacked."""
    from kagura_agent.apply.run.executor import ApplyOptions

    return ApplyOptions(
        approve=tuple(args.approve),
        allow_host_runtime=args.allow_host_runtime,
        interactive=sys.stdin.isatty(),
        approval_timeout=args.approval_timeout,
        answer_floor=args.answer_floor,
        as_json=args.json,
        accept_since=accept_since,
    )


def execute(plan: Plan, options: ApplyOptions, *, confirm: bool) -> int:
    """Show ``plan``, ask when ``confirm`` (a terminal only), apply it; the run's exit code."""
    from kagura_agent.apply.run.executor import apply_plan, refuse_unapplyable
    from kagura_agent.cli.common import print_json, say_daemon_notice
    from kagura_agent.errors import RefusedError
    from kagura_agent.plan.render import render_text
    from kagura_agent.state import open_store
    from kagura_agent.ui import Style

    if not options.as_json:
        sys.stderr.write(render_text(plan, Style.for_stream(sys.stderr)))
        say_daemon_notice([plan])
    # A plan apply would refuse is refused before anyone is asked to confirm it.
    refuse_unapplyable(plan, options)
    if confirm:
        if not options.interactive:
            raise RefusedError("not confirmed: stdin is not a terminal", hint="pass --yes")
        answer = input("Apply this plan? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise RefusedError("not confirmed")
    with open_store() as store:
        result = apply_plan(plan, options, store=store)
    if options.as_json:
        try:
            print_json({"ok": result.exit_code == 0, "errors": [], **result.to_json()})
        except BrokenPipeError:
            # The reader is gone; the outcome is in the state store. Keep the exit code
            # the run's, and let the interpreter's final flush find somewhere to write.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return result.exit_code
