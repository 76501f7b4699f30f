"""kagura-agent plan TASK...: compile tasks into launch plans, show them and what changed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kagura_agent.cli.common import add_manifest_option, print_json, say_daemon_notice
from kagura_agent.errors import ExitCode, UsageError
from kagura_agent.plan.admission import admit
from kagura_agent.plan.model import Plan

if TYPE_CHECKING:
    from kagura_agent.plan.diff import Change


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="compile tasks into launch plans and show what changed"
    )
    parser.add_argument("paths", nargs="+", metavar="TASK", help="task files or folders of tasks")
    add_manifest_option(parser)
    add_output_options(parser)
    parser.add_argument("-o", "--out", metavar="FILE", help="save the plan (one task only)")
    parser.add_argument("--against", metavar="PLAN", help="diff against a saved plan")
    parser.add_argument(
        "--base", metavar="REV", help="diff against the manifests at a git revision"
    )
    parser.add_argument(
        "--detailed-exitcode", action="store_true", help="exit 5 when any plan has changes"
    )
    parser.add_argument(
        "--require-applyable",
        action="store_true",
        help="exit 6 when any plan is not applyable (the default; kept for existing hooks)",
    )
    parser.add_argument(
        "--allow-unapplyable",
        action="store_true",
        help="exit 0 (or 5) even when a plan is not applyable: show refused plans without"
        " failing, e.g. in a review job that posts them",
    )
    parser.add_argument("--facts", metavar="FILE", help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the plan JSON")
    parser.add_argument(
        "--format", choices=("text", "json", "markdown"), default=None, help="output format"
    )


def output_format(args: argparse.Namespace) -> str:
    return "json" if args.json else (args.format or "text")


def run(args: argparse.Namespace) -> int:
    from kagura_agent.plan import planfile
    from kagura_agent.plan.build import plan_tasks

    if args.against and args.base:
        raise UsageError("--against and --base cannot be combined")
    plans = plan_tasks(args.manifests, args.paths, facts_file=args.facts)
    if args.out and len(plans) != 1:
        raise UsageError(f"-o saves one plan, but {len(plans)} tasks were planned")
    fmt = output_format(args)
    if not args.facts:  # facts of this host: its daemon
        say_daemon_notice(list(plans))
    any_changes = False
    outputs: list[dict[str, Any]] = []
    base = _base(args, plans) if args.base else None
    base_plans = base.plans if base else {}
    for plan in plans:
        old, label = _baseline(args, plan, base_plans)
        from kagura_agent.plan.diff import diff_plans

        changes = diff_plans(old, plan)
        any_changes = any_changes or bool(changes)
        outputs.append(result_json(plan, label, changes))
        if fmt == "text":
            _print_text(plan, changes, label)
        elif fmt == "markdown":
            _print_markdown(plan, changes, label)
    if base is not None:
        # A manifest changed or a task gone counts as much as a plan that moved.
        any_changes = any_changes or bool(base.manifest_changes or base.removed)
        if fmt != "json":
            _print_base(base, markdown=fmt == "markdown")
    if fmt == "json":
        print_json(envelope(outputs, base))
    if args.out:
        planfile.save(plans[0], Path(args.out))
        print(f"saved plan to {args.out}", file=sys.stderr)
    refused = [p["task"]["name"] for p in plans if not admit(p).applyable]
    if refused and not args.allow_unapplyable:
        from kagura_agent.errors import RefusedError

        # apply would refuse these: so does plan (exit 6), whatever the diff says.
        error = RefusedError(
            "not applyable: " + ", ".join(refused),
            hint="the plan above says why (DENY, refused); --allow-unapplyable exits 0",
        )
        if fmt != "json":
            raise error
        # The envelope printed above is the answer (each plan's admission says why): no
        # second JSON document on stdout, the reason on stderr.
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    if args.detailed_exitcode and any_changes:
        return int(ExitCode.CHANGES)
    return 0


RESULT_VERSION = 1


def result_json(plan: Plan, against: str | None, changes: list[Any]) -> dict[str, Any]:
    """One task's entry in ``plan --json``: the plan, the verdict apply would give it
    (recomputed, not the one the plan carries) and its diff (docs/plan-format.md)."""
    admission = admit(plan)
    return {
        "task": plan["task"]["name"],
        "plan": plan,
        "admission": {
            "applyable": admission.applyable,
            "refusals": list(admission.refusals),
            "edited": admission.edited,
        },
        "against": against,
        "changes": [change.to_json() for change in changes],
    }


def envelope(results: list[dict[str, Any]], base: BaseDiff | None = None) -> dict[str, Any]:
    """``plan --json`` and ``show --json``: always this object, however many tasks (with
    ``--base``, also what changed in the manifest set and which tasks are gone)."""
    found: dict[str, Any] = {
        "ok": True,
        "version": RESULT_VERSION,
        "errors": [],
        "changed": any(result["changes"] for result in results),
        "plans": results,
    }
    if base is not None:
        found["changed"] = found["changed"] or bool(base.manifest_changes or base.removed)
        found["base"] = {
            "rev": base.rev,
            "manifest_changes": [change.to_json() for change in base.manifest_changes],
            "removed_tasks": base.removed,
            "problems": base.problems,
        }
    return found


@dataclass(frozen=True)
class BaseDiff:
    """What ``--base REV`` compares against: each task as its file and the manifests
    were at REV, the manifest set's own changes, the tasks REV had and the work tree
    does not, and why something could not be compared."""

    rev: str
    plans: dict[str, Plan]
    manifest_changes: list[Change]
    removed: list[str]
    problems: list[str]


def _base(args: argparse.Namespace, plans: list[Plan]) -> BaseDiff:
    """Every task planned from its file and the manifests at ``--base``."""
    from kagura_agent import gitops
    from kagura_agent.errors import KaguraError
    from kagura_agent.plan.build import plan_tasks

    problems: list[str] = []
    found: dict[str, Plan] = {}
    for path in args.paths:
        try:
            at_base = plan_tasks(args.manifests, [path], facts_file=args.facts, base_rev=args.base)
        except UsageError as exc:
            if "no Task documents" not in exc.message:
                raise  # not a git revision, not in git: the command cannot answer
            continue  # no task file there at the base: its tasks are new
        except KaguraError as exc:
            problems.append(f"{path} at {args.base} does not plan: {gitops.problem_text(exc)}")
            continue
        found.update({p["task"]["name"]: p for p in at_base})
    changes, problem = gitops.manifest_changes(args.manifests, args.base)
    problems += [problem] if problem else []
    names = {p["task"]["name"] for p in plans}
    removed = sorted(
        f"{name} ({plan['task']['file']})" for name, plan in found.items() if name not in names
    )
    return BaseDiff(args.base, found, changes, removed, problems)


def _print_base(base: BaseDiff, *, markdown: bool) -> None:
    label = f"the manifests at {base.rev}"
    lines = [f"{'- ' if markdown else '  '}{problem}" for problem in base.problems]
    if base.manifest_changes:
        lines.append(f"Manifest changes against {label}:")
        lines += [f"    {change.render()}" for change in base.manifest_changes]
    else:
        lines.append(f"No manifest changes against {label}.")
    lines += [f"Task removed since {base.rev}: {name}" for name in base.removed]
    if markdown:
        lines = ["```", *lines, "```"]
    print("\n".join(lines))


def _baseline(
    args: argparse.Namespace, plan: Plan, base_plans: dict[str, Plan]
) -> tuple[Mapping[str, Any] | None, str]:
    from kagura_agent.plan import planfile
    from kagura_agent.plan.history import last_applied

    if args.against:
        return planfile.load(Path(args.against)), f"the saved plan {args.against}"
    if args.base:
        return base_plans.get(plan["task"]["name"]), f"the task and manifests at {args.base}"
    return last_applied(plan["task"]["name"]), "the last applied plan"


def _print_text(plan: Plan, changes: list[Any], label: str) -> None:
    from kagura_agent.plan.render import render_text
    from kagura_agent.ui import stdout_style

    style = stdout_style()
    sys.stdout.write(render_text(plan, style))
    if not changes:
        print(f"  no changes against {label}")
    else:
        print(f"  changes against {label}:")
        colours = {"+": "green", "-": "red", "~": "yellow"}
        for change in changes:
            print("    " + style(change.render(), colours[change.op]))
    print()


def _print_markdown(plan: Plan, changes: list[Any], label: str) -> None:
    from kagura_agent.plan.render import markdown_with_changes

    sys.stdout.write(markdown_with_changes(plan, changes, label) + "\n")
