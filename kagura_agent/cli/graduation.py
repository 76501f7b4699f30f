"""``kagura-agent graduation``: trust standing per capability category, and the human unlock.

graduation status [--json]            state, evidence, distinct tasks, span, knobs unmet
graduation proposals [--json]         categories waiting for a human to approve
graduation approve CATEGORY           unlock a proposed category (logged as a decision)
graduation reset CATEGORY             lock a category and restart its count
graduation history [--json]           the approval log plus graduation state changes
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kagura_agent.cli.common import add_manifest_option, count, print_ok

if TYPE_CHECKING:
    from kagura_agent.graduation import Knobs
    from kagura_agent.manifest.catalog import Catalog


def register(subparsers: Any) -> None:
    """Add the ``graduation`` command and its subcommands."""
    parser = subparsers.add_parser(
        "graduation",
        help="capability graduation: evidence, proposals, approvals",
        description="Trust per capability category, earned from verified runs and granted"
        " by a human; one failure demotes a category back to ask-every-time.",
    )
    parser.set_defaults(handler=lambda _args: _usage(parser))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    status = actions.add_parser("status", help="per category: state, evidence, knobs unmet")
    status.add_argument("--json", action="store_true", help="print JSON")
    add_manifest_option(status)
    status.set_defaults(handler=_status)

    proposals = actions.add_parser("proposals", help="categories proposed for graduation")
    proposals.add_argument("--json", action="store_true", help="print JSON")
    add_manifest_option(proposals)
    proposals.set_defaults(handler=_proposals)

    approve = actions.add_parser("approve", help="graduate a proposed category")
    approve.add_argument("category", metavar="CATEGORY", type=_category)
    approve.add_argument("--who", help="recorded as the approver (default: your user name)")
    add_manifest_option(approve)
    approve.set_defaults(handler=_approve)

    reset = actions.add_parser("reset", help="lock a category and restart its count")
    reset.add_argument("category", metavar="CATEGORY", type=_category)
    reset.add_argument("--who", help="recorded as who reset it (default: your user name)")
    reset.add_argument("--reason", default="", help="why (recorded)")
    add_manifest_option(reset)
    reset.set_defaults(handler=_reset)

    history = actions.add_parser("history", help="approval decisions and state changes")
    history.add_argument("--category", type=_category, help="only this category")
    history.add_argument(
        "--limit", type=count(1, 100_000), default=50, help="newest N decisions (50)"
    )
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(handler=_history)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _knobs(args: argparse.Namespace) -> Knobs:
    # The same knobs the planner uses: a manifest raising the bar must not be bypassed by
    # approving from the CLI, so an invalid manifest set refuses here as it does in plan.
    from kagura_agent.graduation.settings import graduation_settings
    from kagura_agent.manifest.workspace import load_workspace

    return graduation_settings(load_workspace(args.manifests, []).catalog).knobs


def _status(args: argparse.Namespace) -> int:
    from kagura_agent.graduation import snapshot
    from kagura_agent.state import open_store

    knobs = _knobs(args)
    with open_store() as store:
        snap = snapshot(store, knobs)
    if args.json:
        print_ok(snap.to_json())
        return 0
    print(f"graduation state v{snap.version}; knobs: {_knob_text(snap.knobs.to_json())}")
    if not snap.categories:
        print("no capability category has evidence yet; every non-baseline one is locked")
        return 0
    rows = [("CATEGORY", "STATE", "EVIDENCE", "TASKS", "SPAN", "UNMET / NOTE")]
    for status in snap.categories.values():
        note = ", ".join(status.unmet)
        if status.state == "graduated":
            note = f"by {status.graduated_by} at {status.graduated_at}"
        elif status.state == "proposed":
            note = f"run: kagura-agent graduation approve {status.category}"
        data = status.to_json()
        rows.append(
            (
                status.category,
                status.state,
                str(status.successes),
                str(status.distinct_tasks),
                str(data["span"]),
                note,
            )
        )
    _table(rows)
    return 0


def _proposals(args: argparse.Namespace) -> int:
    from kagura_agent.graduation import proposals
    from kagura_agent.state import open_store

    knobs = _knobs(args)
    with open_store() as store:
        found = proposals(store, knobs)
    if args.json:
        print_ok({"proposals": [status.to_json() for status in found]})
        return 0
    if not found:
        print("no graduation proposals")
        return 0
    for status in found:
        span = status.to_json()["span"]
        print(
            f"{status.category}: {status.successes} verified successes over"
            f" {status.distinct_tasks} tasks in {span}, no failure since reset"
            f"  → kagura-agent graduation approve {status.category}"
        )
    return 0


# What the planner names categories: image:NAME, credential:PROVIDER/SCOPE, egress:POLICY,
# mount:SOURCE, toolserver:NAME. Anything else is a typo that would otherwise reset or look
# up nothing.
_CATEGORY_KINDS = ("image", "credential", "egress", "mount", "toolserver")


def _category(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or kind not in _CATEGORY_KINDS or not name:
        kinds = ", ".join(f"{k}:…" for k in _CATEGORY_KINDS)
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a capability category ({kinds});"
            " `kagura-agent graduation status` lists the known ones"
        )
    return text


def _defined(catalog: Catalog, category: str) -> bool:
    """Whether the manifests name what ``category`` is about (mounts are paths: never)."""
    kind, _, name = category.partition(":")
    if kind == "image":
        return catalog.get("Image", name) is not None
    if kind == "egress":
        return catalog.get("EgressPolicy", name) is not None
    if kind == "toolserver":
        return catalog.get("ToolServer", name) is not None
    if kind == "credential":
        provider_name, _, scope = name.partition("/")
        provider = catalog.get("CredentialProvider", provider_name)
        return provider is not None and scope in provider.spec.get("scopes", {})
    return False


def _approve(args: argparse.Namespace) -> int:
    from kagura_agent.approvals import operator_name
    from kagura_agent.clock import SystemClock
    from kagura_agent.graduation import approve_graduation
    from kagura_agent.state import open_store

    who = args.who or operator_name()
    knobs = _knobs(args)
    with open_store() as store:
        approve_graduation(store, args.category, who=who, clock=SystemClock(), knobs=knobs)
    print(f"{args.category} graduated by {who}; one failed run demotes it again")
    return 0


def _reset(args: argparse.Namespace) -> int:
    from kagura_agent.approvals import operator_name
    from kagura_agent.clock import SystemClock
    from kagura_agent.graduation import reset
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.state import open_store

    who = args.who or operator_name()
    defined = _defined(load_workspace(args.manifests, []).catalog, args.category)
    with open_store() as store:
        reset(
            store,
            args.category,
            who=who,
            clock=SystemClock(),
            reason=args.reason,
            defined=defined,
        )
    print(f"{args.category} locked; its evidence count starts again from zero")
    return 0


def _history(args: argparse.Namespace) -> int:
    from kagura_agent import approvals
    from kagura_agent.graduation import events
    from kagura_agent.state import open_store

    with open_store() as store:
        decisions = approvals.history(store, category=args.category, limit=args.limit)
        changes = events(store, args.category)
    if args.json:
        payload = {
            "decisions": [decision.to_json() for decision in decisions],
            "graduation_events": changes,
        }
        print_ok(payload)
        return 0
    if not decisions and not changes:
        print("no approval decisions recorded")
        return 0
    rows = [("WHEN", "WHO", "VIA", "CATEGORY", "PLAN", "OUTCOME")]
    for decision in decisions:
        when = decision.to_json()["decided_at"]
        plan = (decision.fingerprint or f"({decision.kind})")[:19]
        rows.append(
            (str(when), decision.who, decision.via, decision.category, plan, decision.outcome)
        )
    if decisions:
        _table(rows)
    if changes:
        if decisions:
            print()
        for change in changes:
            print(
                f"{change['at']}  {change['category']}  {change['event']} by {change['who']}"
                f"  {change['reason']}"
            )
    return 0


def _knob_text(knobs: dict[str, object]) -> str:
    return ", ".join(f"{key} {value}" for key, value in knobs.items())


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
