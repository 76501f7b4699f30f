"""kagura-agent review --base REV: the pull-request comment for what a branch changed.

Plans every task file the branch changed (and, when a manifest changed, every task under
``--tasks``) and prints one markdown comment: what widens a grant first (in the manifests
and in each task's plan), the manifest diff, then each plan with its diff against the
plan the task file and manifests at REV give. A task or manifest that does not validate
is named with each problem's file:line:col. examples/gitops/.github/workflows/
kagura-plan.yml posts it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kagura_agent.cli.common import add_manifest_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "review", help="the markdown plan comment for a branch's changed tasks and manifests"
    )
    parser.add_argument("--base", required=True, metavar="REV", help="the target branch")
    parser.add_argument(
        "--tasks",
        action="append",
        default=[],
        metavar="DIR",
        help="folder of task files, all planned when a manifest changed (repeatable)",
    )
    add_manifest_option(parser)
    parser.add_argument("-o", "--out", metavar="FILE", help="write the comment to FILE")
    parser.add_argument(
        "--require-applyable", action="store_true", help="exit 6 when any plan is not applyable"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent import gitops
    from kagura_agent.errors import KaguraError, RefusedError
    from kagura_agent.manifest.loader import manifests_dir
    from kagura_agent.plan.admission import admit
    from kagura_agent.plan.build import plan_tasks
    from kagura_agent.plan.diff import Change, diff_plans

    cwd = Path.cwd()
    root = gitops.git_root(cwd)
    changed = gitops.changed_files(args.base, cwd)
    tasks, manifest_files = gitops.select_tasks(
        changed, root, manifests_dir(args.manifests), [Path(d) for d in args.tasks]
    )
    removed = gitops.removed_task_files(args.base, cwd)
    sections: list[str] = []
    problems: list[str] = []
    refused: list[str] = []
    widened: list[str] = []
    manifest_diff: list[Change] = []
    if manifest_files:
        manifest_diff, problem = gitops.manifest_changes(args.manifests, args.base)
        if problem:
            problems.append(problem)
        widened += [f"{change.render()}" for change in manifest_diff if change.widens]
    label = f"the task file and manifests at {args.base}"
    for task in tasks:
        shown = str(task.relative_to(root)) if task.is_relative_to(root) else str(task)
        try:
            plans = plan_tasks(args.manifests, [str(task)])
        except KaguraError as exc:
            problems.append(f"`{shown}`: {gitops.problem_text(exc)}")
            continue
        try:
            # The task file as it was at the base, with the manifests there.
            base = {
                p["task"]["name"]: p
                for p in plan_tasks(args.manifests, [str(task)], base_rev=args.base)
            }
        except KaguraError:
            base = {}  # new at the branch, or it did not plan at the base: everything is new
        for plan in plans:
            name = plan["task"]["name"]
            old = base.get(name)
            changes = diff_plans(old, plan)
            sections.append(gitops.plan_section(plan, changes, label))
            widened += [f"{change.render()}  [task {name}]" for change in changes if change.widens]
            if not admit(plan).applyable:
                refused.append(name)
    body = gitops.comment_body(
        args.base,
        sections,
        manifest_files,
        problems,
        widened=widened,
        manifest_diff=manifest_diff,
        removed=removed,
    )
    if args.out:
        Path(args.out).write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
    if problems:
        return 2
    if args.require_applyable and refused:
        raise RefusedError("not applyable: " + ", ".join(refused))
    return 0
