"""The ``status`` view: every open session (then the latest ended ones) with its state,
age, cost so far, and what it is doing (phase), waiting for (queued behind) or waiting
on (approvals, mid-run questions)."""

from __future__ import annotations

import time

from kagura_agent.clock import parse_iso
from kagura_agent.cockpit.desk import Desk, usd


def status_text(desk: Desk) -> str:
    sessions = desk.registry.listing()
    if not sessions:
        return "no sessions yet"
    now = desk.clock.now()
    lines = []
    for s in sessions:
        progress = desk.progress.get(s.id)
        cost = progress.cost_usd if progress is not None else s.cost_usd
        age = _age((now - parse_iso(s.created_at)).total_seconds())
        lines.append(
            f"{s.id}  {s.state:<17} {age:>5}  {usd(cost):>8}  {s.task_name:<20}"
            f" {s.run_id or '-':<16} by {s.requested_by}"
        )
        if s.state == "running":
            if progress is not None:
                since = _age(time.monotonic() - progress.since)
                lines.append(f"    phase: {progress.phase} (for {since})")
            else:
                lines.append("    phase: followed after a restart")
        elif s.state == "queued":
            lines.append(f"    queued behind {desk.behind.get(s.id, 'a restart')}")
        elif s.state == "awaiting-approval":
            asked = parse_iso(s.asked_at or s.created_at)
            left = desk.config.approval_timeout - (now - asked).total_seconds()
            lines.append(
                f"    pending approval: {', '.join(s.categories)}"
                f" (approve {s.id} | deny {s.id}; denied in {max(left, 0):.0f}s)"
            )
        for question in desk.midrun.open_for(s.id):
            lines.append(
                f"    asks mid-run: {question.category}"
                f" (approve {question.request} | deny {question.request})"
            )
    return "\n".join(lines)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
