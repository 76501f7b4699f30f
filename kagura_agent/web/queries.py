"""Every read the console makes of the state store, in one place.

Each function takes a read-only ``StateStore`` (``StateStore.read_only``: nothing created,
nothing migrated, the SQLite side files left alone) and returns plain dicts, newest first
where there is an order, and bounded: no page reads more than ``limit`` rows, whatever
the store holds. A component the store does not hold yet (never used) reads as empty; one
whose schema is older than this kagura-agent's reads as empty too, with a note saying so
(``Notes``), as ``plan`` does. The tables belong to their components (apply, egress,
leases, approvals, graduation, team, cockpit): when they move, only this module follows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kagura_agent.apply.midrun.grants import MIGRATIONS as AMENDMENT_MIGRATIONS
from kagura_agent.apply.records.incidents import MIGRATIONS as INCIDENT_MIGRATIONS
from kagura_agent.apply.records.journal import COMPONENT as JOURNAL
from kagura_agent.apply.records.journal import MIGRATIONS as JOURNAL_MIGRATIONS
from kagura_agent.approvals.log import MIGRATIONS as APPROVAL_MIGRATIONS
from kagura_agent.clock import parse_iso
from kagura_agent.cockpit.registry import MIGRATIONS as SESSION_MIGRATIONS
from kagura_agent.graduation.knobs import Knobs
from kagura_agent.graduation.ledger import MIGRATIONS as GRADUATION_MIGRATIONS
from kagura_agent.graduation.ledger import snapshot
from kagura_agent.membrane.egress.audit import COMPONENT as EGRESS
from kagura_agent.membrane.egress.audit import MIGRATIONS as EGRESS_MIGRATIONS
from kagura_agent.membrane.leases.ledger import COMPONENT as LEASES
from kagura_agent.membrane.leases.ledger import MIGRATIONS as LEASE_MIGRATIONS
from kagura_agent.plan.history import MIGRATIONS as PLAN_MIGRATIONS
from kagura_agent.state import SchemaBehind, StateDbError, StateStore
from kagura_agent.state.history import MIGRATIONS as RUN_MIGRATIONS
from kagura_agent.state.sql import Migration

PAGE = 50  # rows of a list page
TIMELINE = 500  # journal items of a run page
EGRESS_PAGE = 200  # egress decisions of a run page
CHART_RUNS = 200  # runs of a task kind a chart shows
FILTER_WINDOW = 1_000  # the newest runs whose outcomes and hosts fill the filters


COMPONENTS: dict[str, Sequence[Migration]] = {
    "runs": RUN_MIGRATIONS,
    JOURNAL: JOURNAL_MIGRATIONS,
    EGRESS: EGRESS_MIGRATIONS,
    LEASES: LEASE_MIGRATIONS,
    "amendments": AMENDMENT_MIGRATIONS,
    "incidents": INCIDENT_MIGRATIONS,
    "approvals": APPROVAL_MIGRATIONS,
    "graduation": GRADUATION_MIGRATIONS,
    "cockpit": SESSION_MIGRATIONS,
    "plans": PLAN_MIGRATIONS,
}

RUN_COLUMNS = (
    "run_id, task, kind, host, session, fingerprint, started_at, ended_at, outcome,"
    " exit_code, turns, model_calls, cost_usd, budget"
)


@dataclass
class Notes:
    """What the store could not tell this page (an older schema), said once each."""

    lines: list[str] = field(default_factory=list)

    def ready(self, store: StateStore, component: str) -> bool:
        """Whether ``component``'s tables are there at this kagura-agent's version."""
        try:
            store.migrate(component, COMPONENTS[component])  # read-only: a version check
        except SchemaBehind as exc:
            if exc.current and exc.message not in self.lines:
                self.lines.append(exc.message)
            return False
        return True


@dataclass(frozen=True)
class RunFilter:
    kind: str | None = None
    outcome: str | None = None  # an outcome, or "open" for runs still going
    runner: str | None = None  # the host that applied it


def runs_page(
    store: StateStore,
    notes: Notes,
    where: RunFilter,
    before: tuple[str, str] | None = None,
    limit: int = PAGE,
) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """One page of runs, newest first, older than ``before`` (started_at, run_id); the
    cursor of the next page (None: this was the last)."""
    if not notes.ready(store, "runs"):
        return [], None
    clauses: list[str] = []
    params: list[Any] = []
    if where.kind:
        clauses.append("kind = ?")
        params.append(where.kind)
    if where.outcome == "open":
        clauses.append("ended_at IS NULL")
    elif where.outcome:
        clauses.append("outcome = ?")
        params.append(where.outcome)
    if where.runner:
        clauses.append("host = ?")
        params.append(where.runner)
    if before is not None:
        clauses.append("(started_at < ? OR (started_at = ? AND run_id < ?))")
        params += [before[0], before[0], before[1]]
    sql = f"SELECT {RUN_COLUMNS} FROM runs"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY started_at DESC, run_id DESC LIMIT ?"
    rows = [_run(row) for row in store.conn.execute(sql, (*params, limit + 1)).fetchall()]
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = (rows[-1]["started_at"], rows[-1]["run_id"]) if more and rows else None
    return rows, cursor


def run_filters(store: StateStore, notes: Notes) -> dict[str, list[str]]:
    """The values the runs list can be filtered by (task kinds, outcomes, runners)."""
    if not notes.ready(store, "runs"):
        return {"kinds": [], "outcomes": [], "runners": []}

    kinds = [
        str(row["kind"])
        for row in store.conn.execute(
            "SELECT DISTINCT kind FROM runs WHERE kind IS NOT NULL ORDER BY kind LIMIT 100"
        ).fetchall()
    ]  # the runs_kind index answers this without reading the runs
    outcomes: set[str] = set()
    runners: set[str] = set()
    for row in store.conn.execute(
        "SELECT outcome, host FROM runs ORDER BY started_at DESC LIMIT ?", (FILTER_WINDOW,)
    ).fetchall():
        if row["outcome"] is not None:
            outcomes.add(str(row["outcome"]))
        if row["host"] is not None:
            runners.add(str(row["host"]))
    return {"kinds": kinds, "outcomes": sorted(outcomes), "runners": sorted(runners)[:100]}


def run(store: StateStore, notes: Notes, run_id: str) -> dict[str, Any] | None:
    if not notes.ready(store, "runs"):
        return None
    row = store.conn.execute(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    return _run(row) if row is not None else None


def _run(row: Any) -> dict[str, Any]:
    found = dict(row)
    found["budget"] = json.loads(found["budget"]) if found.get("budget") else None
    started, ended = found.get("started_at"), found.get("ended_at")
    found["seconds"] = _seconds(started, ended) if started and ended else None
    return found


def _seconds(start: str, end: str) -> float | None:
    try:
        return max(0.0, (parse_iso(end) - parse_iso(start)).total_seconds())
    except ValueError:
        return None


def journal(
    store: StateStore, notes: Notes, run_id: str, limit: int = TIMELINE
) -> list[dict[str, Any]]:
    """The newest ``limit`` items of the run's journal (what its live view showed), oldest
    first."""
    if not notes.ready(store, JOURNAL):
        return []
    rows = store.conn.execute(
        "SELECT seq, at, kind, item FROM run_events WHERE run_id = ? ORDER BY seq DESC LIMIT ?",
        (run_id, limit),
    ).fetchall()
    return [
        {"seq": row["seq"], "at": row["at"], "kind": row["kind"], "item": _json(row["item"])}
        for row in reversed(rows)
    ]


def journal_count(store: StateStore, notes: Notes, run_id: str) -> int:
    if not notes.ready(store, JOURNAL):
        return 0
    row = store.conn.execute(
        "SELECT COUNT(*) AS n FROM run_events WHERE run_id = ?", (run_id,)
    ).fetchone()
    return int(row["n"]) if row else 0


def egress(
    store: StateStore,
    notes: Notes,
    run_id: str,
    decision: str | None = None,
    after: int = 0,
    limit: int = EGRESS_PAGE,
) -> list[dict[str, Any]]:
    """The run's egress decisions after ``after`` (seq), oldest first."""
    if not notes.ready(store, EGRESS):
        return []
    sql = (
        "SELECT seq, time, method, scheme, host, port, path, status, decision, reason, entry,"
        " inport FROM egress_events WHERE run_id = ? AND seq > ?"
    )
    params: list[Any] = [run_id, after]
    if decision in ("allow", "deny"):
        sql += " AND decision = ?"
        params.append(decision)
    rows = store.conn.execute(sql + " ORDER BY seq LIMIT ?", (*params, limit)).fetchall()
    return [dict(row) for row in rows]


def egress_latest(
    store: StateStore, notes: Notes, run_id: str, limit: int = EGRESS_PAGE
) -> list[dict[str, Any]]:
    """The run's newest ``limit`` egress decisions, oldest first."""
    if not notes.ready(store, EGRESS):
        return []
    rows = store.conn.execute(
        "SELECT seq, time, method, scheme, host, port, path, status, decision, reason, entry,"
        " inport FROM egress_events WHERE run_id = ? ORDER BY seq DESC LIMIT ?",
        (run_id, limit),
    ).fetchall()
    return [dict(row) for row in reversed(rows)]


def egress_counts(store: StateStore, notes: Notes, run_id: str) -> dict[str, int]:
    """Decisions stored and counted past the ceiling, per decision."""
    counts = {"allow": 0, "deny": 0, "unstored_allow": 0, "unstored_deny": 0}
    if not notes.ready(store, EGRESS):
        return counts
    for row in store.conn.execute(
        "SELECT decision, COUNT(*) AS n FROM egress_events WHERE run_id = ? GROUP BY decision",
        (run_id,),
    ).fetchall():
        counts[str(row["decision"])] = int(row["n"])
    found = store.conn.execute(
        "SELECT unstored_allow, unstored_deny FROM egress_runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    if found is not None:
        counts["unstored_allow"] = int(found["unstored_allow"])
        counts["unstored_deny"] = int(found["unstored_deny"])
    return counts


def leases(store: StateStore, notes: Notes, run_id: str, limit: int = 200) -> list[dict[str, Any]]:
    """The run's ledger rows (one per mint, renewals too), oldest first: references and
    ids only, never a value."""
    if not notes.ready(store, LEASES):
        return []
    rows = store.conn.execute(
        "SELECT id, lease, name, provider, scope, class, ttl_seconds, state, expires_at,"
        " created_at, closed_at, note, last_error FROM lease_grants WHERE run_id = ?"
        " ORDER BY created_at, id LIMIT ?",
        (run_id, limit),
    ).fetchall()
    return [dict(row) for row in rows]


def amendments(
    store: StateStore, notes: Notes, run_id: str, limit: int = 200
) -> list[dict[str, Any]]:
    """The run's mid-run requests and extensions with their outcomes, oldest first."""
    if not notes.ready(store, "amendments"):
        return []
    rows = store.conn.execute(
        "SELECT at, request, kind, name, reason, category, fingerprint, outcome, who, detail"
        " FROM run_amendments WHERE run_id = ? ORDER BY id LIMIT ?",
        (run_id, limit),
    ).fetchall()
    return [dict(row) for row in rows]


def incidents(
    store: StateStore, notes: Notes, run_id: str | None = None, limit: int = PAGE
) -> list[dict[str, Any]]:
    """Incidents, newest first (of one run, or all)."""
    if not notes.ready(store, "incidents"):
        return []
    sql = "SELECT id, at, run_id, task, reason, actions, egress FROM incidents"
    params: list[Any] = []
    if run_id is not None:
        sql += " WHERE run_id = ?"
        params.append(run_id)
    rows = store.conn.execute(sql + " ORDER BY at DESC, id LIMIT ?", (*params, limit)).fetchall()
    found = []
    for row in rows:
        item = dict(row)
        item["actions"] = _json(item["actions"]) or []
        egress_seen = _json(item.pop("egress")) or []
        item["denied"] = [e for e in egress_seen if e.get("decision") == "deny"][:20]
        found.append(item)
    return found


def evidence(store: StateStore, notes: Notes, run_id: str) -> list[dict[str, Any]]:
    """The graduation evidence the run earned or cost (from its verify exit codes)."""
    if not notes.ready(store, "graduation"):
        return []
    rows = store.conn.execute(
        "SELECT category, outcome, recorded_at, verify FROM graduation_evidence"
        " WHERE run_id = ? ORDER BY id LIMIT 100",
        (run_id,),
    ).fetchall()
    return [dict(row) for row in rows]


def graduation(store: StateStore, notes: Notes, knobs: Knobs) -> dict[str, Any]:
    """Every category's standing (``graduation status``) and the latest state changes."""
    if not notes.ready(store, "graduation") or not notes.ready(store, "approvals"):
        return {"categories": [], "events": [], "knobs": knobs.to_json()}
    found = snapshot(store, knobs)
    rows = store.conn.execute(
        "SELECT at, category, event, who, run_id, reason FROM graduation_events"
        " ORDER BY id DESC LIMIT 100"
    ).fetchall()
    return {
        "categories": [status.to_json() for status in found.categories.values()],
        "events": [dict(row) for row in rows],
        "knobs": knobs.to_json(),
    }


def cost_kinds(store: StateStore, notes: Notes) -> list[dict[str, Any]]:
    """Task kinds with finished runs, and how many."""
    if not notes.ready(store, "runs"):
        return []
    rows = store.conn.execute(
        "SELECT kind, COUNT(*) AS runs FROM runs WHERE kind IS NOT NULL"
        " GROUP BY kind ORDER BY kind LIMIT 100"
    ).fetchall()
    return [{"kind": str(row["kind"]), "runs": int(row["runs"])} for row in rows]


def cost_history(
    store: StateStore, notes: Notes, kind: str, limit: int = CHART_RUNS
) -> list[dict[str, Any]]:
    """The newest finished runs of ``kind``, oldest first: what each took (turns the brain
    reported, model calls the proxy counted, dollars reported, wall seconds) and the
    budget and forecast its plan carried."""
    if not notes.ready(store, "runs"):
        return []
    rows = store.conn.execute(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE kind = ? AND ended_at IS NOT NULL"
        # started_at is to the second; opened_ns orders runs started within one.
        " ORDER BY started_at DESC, opened_ns DESC, run_id DESC LIMIT ?",
        (kind, limit),
    ).fetchall()
    return [_run(row) for row in reversed(rows)]


def pending_questions(
    store: StateStore, notes: Notes, now: datetime, limit: int = 100
) -> list[dict[str, Any]]:
    """Mid-run questions of open runs that nobody answered yet and that have not lapsed,
    oldest first: each with its run, request id, category, fingerprint and the text (the
    question and the plan diff) the run asked with."""
    if not (notes.ready(store, JOURNAL) and notes.ready(store, "runs")):
        return []
    rows = store.conn.execute(
        "SELECT e.run_id, e.at, e.item, r.task FROM run_events e JOIN runs r"
        " ON r.run_id = e.run_id WHERE e.kind = 'ask' AND r.ended_at IS NULL"
        " ORDER BY e.at LIMIT ?",
        (limit,),
    ).fetchall()
    found = []
    for row in rows:
        item = _json(row["item"])
        if not isinstance(item, dict) or not isinstance(item.get("request"), str):
            continue
        timeout = item.get("timeout")
        if not isinstance(timeout, int | float):
            continue
        if (now - parse_iso(str(row["at"]))).total_seconds() > float(timeout):
            continue  # lapsed: the run recorded the timeout itself
        if _answered(store, notes, item["request"]):
            continue
        found.append({"run_id": row["run_id"], "task": row["task"], "asked_at": row["at"], **item})
    return found


def _answered(store: StateStore, notes: Notes, request: str) -> bool:
    if (
        notes.ready(store, "approvals")
        and store.conn.execute(
            "SELECT 1 FROM approval_decisions WHERE request = ? LIMIT 1", (request,)
        ).fetchone()
    ):
        return True
    return bool(
        notes.ready(store, "amendments")
        and store.conn.execute(
            "SELECT 1 FROM run_amendments WHERE request = ? LIMIT 1", (request,)
        ).fetchone()
    )


def question(store: StateStore, notes: Notes, now: datetime, request: str) -> dict[str, Any] | None:
    """The pending question ``request``, or None (answered, lapsed, or never asked)."""
    for found in pending_questions(store, notes, now):
        if found["request"] == request:
            return found
    return None


def waiting_sessions(store: StateStore, notes: Notes, limit: int = 100) -> list[dict[str, Any]]:
    """Cockpit sessions waiting for an operator's approval (in their chat, or here)."""
    if not notes.ready(store, "cockpit"):
        return []
    rows = store.conn.execute(
        "SELECT id, transport, requested_by, task_name, fingerprint, needs, asked_at, plan_path"
        " FROM cockpit_sessions WHERE state = 'awaiting-approval' ORDER BY created_at LIMIT ?",
        (limit,),
    ).fetchall()
    return [dict(row) for row in rows]


def last_applied_plan(store: StateStore, notes: Notes, task: str) -> dict[str, Any] | None:
    """The plan last applied for ``task`` in this store (what a new plan is shown against)."""
    if not notes.ready(store, "plans"):
        return None
    row = store.conn.execute(
        "SELECT plan_json FROM applied_plans WHERE task = ?", (task,)
    ).fetchone()
    found = _json(row["plan_json"]) if row else None
    return found if isinstance(found, dict) else None


def decisions(store: StateStore, notes: Notes, limit: int = PAGE) -> list[dict[str, Any]]:
    """The approval log, newest first."""
    if not notes.ready(store, "approvals"):
        return []
    rows = store.conn.execute(
        "SELECT decided_at, who, via, kind, category, fingerprint, outcome, reason, request"
        " FROM approval_decisions ORDER BY id DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [dict(row) for row in rows]


def team(store: StateStore, limit: int = PAGE) -> dict[str, Any] | None:
    """The team queue (PostgreSQL only; None on the embedded store): runners with the
    latest heartbeat of the worker running each one's jobs, runs by status, and the
    newest queued, running and lost runs."""
    if store.dialect != "postgres":
        return None
    try:
        runners = [
            dict(row)
            for row in store.conn.execute(
                "SELECT name, host, pid, concurrency, queues, started_at FROM kagura_team_runners"
                " ORDER BY name LIMIT 100"
            ).fetchall()
        ]
        beats = {
            str(row["runner"]): row["heartbeat"]
            for row in store.conn.execute(
                "SELECT r.runner AS runner, MAX(w.last_heartbeat) AS heartbeat"
                " FROM kagura_team_runs r JOIN procrastinate_jobs j ON j.id = r.job_id"
                " JOIN procrastinate_workers w ON w.id = j.worker_id"
                " WHERE r.status = 'running' GROUP BY r.runner"
            ).fetchall()
        }
        workers = [
            dict(row)
            for row in store.conn.execute(
                "SELECT id, last_heartbeat FROM procrastinate_workers"
                " ORDER BY last_heartbeat DESC LIMIT 100"
            ).fetchall()
        ]
        counts = {
            str(row["status"]): int(row["n"])
            for row in store.conn.execute(
                "SELECT status, COUNT(*) AS n FROM kagura_team_runs GROUP BY status"
            ).fetchall()
        }
        recent = [
            dict(row)
            for row in store.conn.execute(
                "SELECT run_id, task, queue, status, runner, exit_code, message, enqueued_by,"
                " enqueued_at, started_at, ended_at FROM kagura_team_runs"
                " WHERE status IN ('queued', 'running', 'lost')"
                " ORDER BY enqueued_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        ]
    except StateDbError:  # the team schema is not there: no runner has started yet
        return {"runners": [], "workers": [], "counts": {}, "runs": []}
    for runner in runners:
        runner["heartbeat"] = beats.get(str(runner["name"]))
    return {"runners": runners, "workers": workers, "counts": counts, "runs": recent}


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None
