"""One run's timeline: its journal, egress decisions, leases, mid-run requests, incidents
and graduation evidence merged in time order, and its phases with their durations.

Pure: takes what ``queries`` read and returns plain ``Entry`` values; the template shows
them as text (every string the agent could have written is data, never markup).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kagura_agent.apply.records import progress
from kagura_agent.apply.records.live import tool_call_detail
from kagura_agent.clock import parse_iso

# An entry's tone: how it is marked on the page (a class, never a colour from the data).
# Text the agent wrote is only ever in an entry whose tone has "agent" (its frame on the
# page), never in the detail of one of ours.
Tone = str  # "info" | "good" | "bad" | "warn" | "agent" | "agent bad" | "quiet"


@dataclass(frozen=True)
class Entry:
    at: str
    source: str  # journal | egress | lease | request | incident | evidence
    kind: str  # phase, tool call, denied, minted, …
    title: str
    detail: str = ""
    tone: Tone = "info"


@dataclass(frozen=True)
class Phase:
    title: str
    at: str
    seconds: float | None  # until the next phase (or the run's end); None: still going


def _when(text: Any) -> datetime | None:
    try:
        return parse_iso(str(text))
    except ValueError:
        return None


def journal_entries(items: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """What the live view showed, as entries."""
    entries = []
    for row in items:
        at, kind, item = str(row["at"]), str(row["kind"]), row["item"]
        entry = _journal_entry(at, kind, item)
        if entry is not None:
            entries.append(entry)
        if kind == "verify" and isinstance(item, dict):
            entries += _verify_output(at, item)
    return entries


def _verify_output(at: str, item: Mapping[str, Any]) -> list[Entry]:
    """A failed verify command's output tail: the agent's (verify runs what it left in the
    tree), so an entry of its own in the agent's tone, never inside ours."""
    return [
        Entry(at, "journal", "verify output", f"{r.get('command')}", str(r["tail"]), "agent")
        for r in item.get("results") or []
        if isinstance(r, dict) and r.get("tail")
    ]


def _journal_entry(at: str, kind: str, item: Any) -> Entry | None:
    if not isinstance(item, dict):
        return None
    event = progress.from_json({**item, "kind": kind})
    if event is not None and event.kind == "phase":
        return Entry(at, "journal", "phase", event.message)
    if event is not None:  # a note, in the tone of its severity
        return Entry(at, "journal", "note", event.message, tone=progress.TONES[event.severity])
    if kind == "ask":
        text = f"{item.get('request', '')}: {item.get('category', '')}"
        return Entry(at, "journal", "question", text, str(item.get("text", "")), "warn")
    if kind == "verify":
        results = item.get("results") or []
        failed = [r for r in results if isinstance(r, dict) and r.get("exit_code") != 0]
        lines = [
            f"{'✓' if r.get('exit_code') == 0 else '✗'} {r.get('command')} exited"
            f" {r.get('exit_code')}"
            for r in results
            if isinstance(r, dict)
        ]
        title = f"verify: {len(results) - len(failed)} of {len(results)} passed"
        return Entry(at, "journal", "verify", title, "\n".join(lines), "bad" if failed else "good")
    if kind == "incident":
        title = f"incident {item.get('id', '')}: {item.get('reason', '')}"
        return Entry(at, "journal", "tripwire", title, tone="bad")
    if kind == "unstored":
        title = f"{item.get('count', 0)} more events were not kept (the run's ceiling)"
        return Entry(at, "journal", "note", title, tone="warn")
    if kind == "brain":
        return _brain_entry(at, item)
    return None


def _brain_entry(at: str, item: Mapping[str, Any]) -> Entry | None:
    kind = item.get("type")
    if kind == "text":
        return Entry(
            at, "journal", "agent text", "the agent wrote", str(item.get("text", "")), "agent"
        )
    if kind == "tool_call":
        detail = tool_call_detail(item.get("input", {}))
        return Entry(at, "journal", "tool call", f"▸ {item.get('name', '')}", detail, "agent")
    if kind == "tool_result":
        code = item.get("exit_code")
        failed = bool(item.get("is_error")) or (isinstance(code, int) and code != 0)
        title = f"exit {code}" if code is not None else "done"
        return Entry(
            at,
            "journal",
            "tool result",
            title,
            str(item.get("output", "")),
            "agent bad" if failed else "agent",  # the agent's output, failed or not
        )
    if kind == "cost":
        usd = item.get("usd")
        spent = f"${usd:.4f}" if isinstance(usd, int | float) else "cost unknown"
        tokens = (item.get("input_tokens") or 0) + (item.get("output_tokens") or 0)
        title = f"{spent}, {item.get('turns') or 0} turns, {tokens:,} tokens (reported)"
        return Entry(at, "journal", "cost", title, tone="quiet")
    if kind == "checkpoint":
        title = f"checkpoint: step {item.get('step')} done, {item.get('pending')} pending"
        return Entry(at, "journal", "checkpoint", title, tone="quiet")
    if kind == "done":
        result = str(item.get("result") or "")
        return Entry(at, "journal", "brain done", "brain finished", result, "agent")
    if kind == "error":
        title = f"brain error ({item.get('code', '')})"
        return Entry(at, "journal", "brain error", title, str(item.get("message", "")), "bad")
    return None


def egress_entries(events: Iterable[Mapping[str, Any]]) -> list[Entry]:
    entries = []
    for event in events:
        denied = event.get("decision") == "deny"
        where = f"{event.get('method', '')} {event.get('scheme', '')}://{event.get('host', '')}:{event.get('port', '')}{event.get('path', '')}"
        why = str(event.get("reason") or "")
        entry = f" (entry {event['entry']})" if event.get("entry") else ""
        entries.append(
            Entry(
                str(event.get("time", "")),
                "egress",
                "denied" if denied else "allowed",
                f"{'⊘ denied' if denied else 'allowed'} {where}",
                f"{why}{entry}",
                "bad" if denied else "quiet",
            )
        )
    return entries


def lease_entries(rows: Sequence[Mapping[str, Any]]) -> list[Entry]:
    """Each ledger row is a mint (the first of its lease) or a renewal, and later closed."""
    entries = []
    seen: set[str] = set()
    for row in rows:
        what = f"{row.get('provider')}/{row.get('scope')} ({row.get('class')})"
        renewal = row.get("lease") in seen
        seen.add(str(row.get("lease")))
        verb = "renewed" if renewal else "minted"
        expires = f", expires {row['expires_at']}" if row.get("expires_at") else ""
        tone = "bad" if row.get("state") in ("failed", "refused", "poison") else "info"
        entries.append(
            Entry(
                str(row.get("created_at")),
                "lease",
                verb,
                f"lease {verb}: {what}{expires}",
                tone=tone,
            )
        )
        if row.get("closed_at"):
            note = str(row.get("note") or row.get("last_error") or "")
            entries.append(
                Entry(
                    str(row["closed_at"]),
                    "lease",
                    str(row.get("state")),
                    f"lease {row.get('state')}: {what}",
                    note,
                    "warn" if row.get("state") == "revoked" else "quiet",
                )
            )
    return entries


def request_entries(rows: Iterable[Mapping[str, Any]]) -> list[Entry]:
    entries = []
    for row in rows:
        outcome = str(row.get("outcome"))
        title = (
            f"mid-run request {row.get('request')}: {row.get('kind')} {row.get('name')!s}"
            f" — {outcome} ({row.get('who')})"
        )
        tone = (
            "good"
            if outcome == "granted"
            else "bad"
            if outcome in ("denied", "refused")
            else "warn"
        )
        entries.append(
            Entry(str(row.get("at")), "request", outcome, title, str(row.get("reason", "")), tone)
        )
    return entries


def incident_entries(rows: Iterable[Mapping[str, Any]]) -> list[Entry]:
    return [
        Entry(
            str(row.get("at")),
            "incident",
            "tripwire",
            f"tripwire {row.get('id')}: {row.get('reason')}",
            "; ".join(str(a) for a in row.get("actions") or []),
            "bad",
        )
        for row in rows
    ]


def evidence_entries(rows: Iterable[Mapping[str, Any]]) -> list[Entry]:
    return [
        Entry(
            str(row.get("recorded_at")),
            "evidence",
            str(row.get("outcome")),
            f"graduation evidence: {row.get('category')} {row.get('outcome')}",
            tone="good" if row.get("outcome") == "success" else "bad",
        )
        for row in rows
    ]


def merged(*sources: Sequence[Entry]) -> list[Entry]:
    """Every entry in time order (an entry whose time cannot be read goes last); entries
    of the same moment keep their sources' order."""
    order = {"journal": 0, "lease": 1, "egress": 2, "request": 3, "incident": 4, "evidence": 5}
    flat = [(index, entry) for source in sources for index, entry in enumerate(source)]

    def key(pair: tuple[int, Entry]) -> tuple[int, datetime | str, int, int]:
        index, entry = pair
        moment = _when(entry.at)
        if moment is None:
            return (1, "", order.get(entry.source, 9), index)
        return (0, moment, order.get(entry.source, 9), index)

    return [entry for _, entry in sorted(flat, key=key)]


def phases(entries: Sequence[Entry], ended_at: str | None) -> list[Phase]:
    """The journal's phases, each lasting until the next one (the last until the run's
    end, or None while it goes on)."""
    marks = [e for e in entries if e.source == "journal" and e.kind == "phase"]
    found = []
    for index, mark in enumerate(marks):
        end = marks[index + 1].at if index + 1 < len(marks) else ended_at
        start_at, end_at = _when(mark.at), _when(end) if end else None
        seconds = max(0.0, (end_at - start_at).total_seconds()) if start_at and end_at else None
        found.append(Phase(mark.title, mark.at, seconds))
    return found
