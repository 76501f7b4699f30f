"""The console's pages: a Starlette app over the state store, rendered by Jinja2.

Every page opens the store read-only for the request (``StateStore.read_only``, its own
connection: handlers run in Starlette's thread pool) and reads it through ``queries``.
Only an approval (``--allow-approvals``) writes, through the approval log's own function,
on a writable store opened for that one decision.

Every value a template prints passes ``shown`` (Jinja's ``finalize``): secrets shaped like
key material redacted, control characters (terminal escapes, bidi overrides) made
visible; then Jinja's autoescape makes it text. Whatever the agent wrote is never markup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kagura_agent.approvals.midrun import Asked, record_answer
from kagura_agent.clock import Clock, parse_iso
from kagura_agent.cockpit.registry import Registry
from kagura_agent.errors import KaguraError
from kagura_agent.graduation.knobs import Knobs
from kagura_agent.hygiene import neutralise, redact_secrets
from kagura_agent.plan import planfile
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.render import render_text
from kagura_agent.state import Location, StateStore, describe
from kagura_agent.ui import Style
from kagura_agent.web import queries, timeline
from kagura_agent.web.charts import Series, legend, line_chart
from kagura_agent.web.queries import Notes, RunFilter
from kagura_agent.web.security import Guard, Session, Sessions, cookie_header, csrf_ok

HERE = Path(__file__).resolve().parent
FORM_BYTES = 4096
NAV = (
    ("/", "Runs"),
    ("/costs", "Costs"),
    ("/graduation", "Graduation"),
    ("/queue", "Team queue"),
    ("/incidents", "Incidents"),
    ("/approvals", "Approvals"),
)


@dataclass(frozen=True)
class ConsoleConfig:
    location: Location  # the state store
    knobs: Knobs  # graduation knobs (the operator's Graduation manifest)
    clock: Clock
    approver: str | None = None  # who answers (``web:ID``); None: read-only
    operators: frozenset[str] = frozenset()  # the Transport's operators (shown)
    secure: bool = False  # served over TLS: the cookie is Secure
    origin: str = ""  # scheme://host:port the browser sees, for the Origin check
    port: int = 0
    loopback_only: bool = True


def shown(value: Any) -> Any:
    """Every printed value: key material redacted, control characters made visible."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return neutralise(redact_secrets(value))


def _when(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = parse_iso(str(value))
        except ValueError:
            return str(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or math.isnan(seconds):
        return ""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _usd(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, int | float) else ""


def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        finalize=shown,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=_when, duration=_duration, usd=_usd)
    return env


class Console:
    """The handlers, bound to one configuration and session store."""

    def __init__(self, config: ConsoleConfig, sessions: Sessions) -> None:
        self.config = config
        self.sessions = sessions
        self.env = templates()

    @contextmanager
    def store(self) -> Iterator[StateStore | None]:
        store = StateStore.read_only(self.config.location)
        if store is None:
            yield None
            return
        with store:
            yield store

    def page(self, request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        session: Session = request.scope["state"]["session"]
        html = self.env.get_template(name).render(
            nav=NAV,
            path=request.url.path,
            csrf=session.csrf,
            approver=self.config.approver,
            store_name=describe(self.config.location),
            **values,
        )
        return HTMLResponse(html, status_code=status)

    # --- login ---------------------------------------------------------------------------

    def login(self, request: Request) -> Response:
        session = self.sessions.login(request.query_params.get("token", ""))
        if session is None:
            return PlainTextResponse(
                "this login link was used already or is wrong: restart `kagura-agent web`"
                " for a new one",
                status_code=401,
            )
        response = RedirectResponse("/", status_code=303)
        response.headers.append("set-cookie", cookie_header(session, secure=self.config.secure))
        return response

    # --- runs ----------------------------------------------------------------------------

    def runs(self, request: Request) -> Response:
        params = request.query_params
        where = RunFilter(
            kind=params.get("kind") or None,
            outcome=params.get("outcome") or None,
            runner=params.get("runner") or None,
        )
        before = _cursor(params.get("before", ""))
        notes = Notes()
        rows: list[dict[str, Any]] = []
        cursor: tuple[str, str] | None = None
        filters: dict[str, list[str]] = {"kinds": [], "outcomes": [], "runners": []}
        with self.store() as store:
            if store is not None:
                rows, cursor = queries.runs_page(store, notes, where, before)
                filters = queries.run_filters(store, notes)
        keep = {k: v for k, v in (("kind", where.kind), ("outcome", where.outcome),
                                  ("runner", where.runner)) if v}  # fmt: skip
        older = "?" + urlencode({**keep, "before": f"{cursor[0]}|{cursor[1]}"}) if cursor else None
        return self.page(
            request,
            "runs.html",
            runs=rows,
            where=where,
            filters=filters,
            older=older,
            notes=notes.lines,
            paged=before is not None,
            missing=self._missing(),
        )

    def run(self, request: Request) -> Response:
        return self._run_page(request, "run.html")

    def run_live(self, request: Request) -> Response:
        return self._run_page(request, "run_live.html")

    def _run_page(self, request: Request, name: str) -> Response:
        run_id = request.path_params["run_id"]
        notes = Notes()
        with self.store() as store:
            found = queries.run(store, notes, run_id) if store is not None else None
            if store is None or found is None:
                return self.page(request, "missing.html", 404, what=f"run {run_id}")
            view = _RunView.read(store, notes, found)
        return self.page(request, name, run=found, view=view, notes=notes.lines)

    def egress(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        decision = request.query_params.get("decision") or None
        after = _int(request.query_params.get("after", "0"))
        notes = Notes()
        with self.store() as store:
            found = queries.run(store, notes, run_id) if store is not None else None
            if store is None or found is None:
                return self.page(request, "missing.html", 404, what=f"run {run_id}")
            events = queries.egress(store, notes, run_id, decision, after)
            counts = queries.egress_counts(store, notes, run_id)
        more = len(events) == queries.EGRESS_PAGE
        keep = {"decision": decision} if decision else {}
        later = "?" + urlencode({**keep, "after": events[-1]["seq"]}) if more else None
        return self.page(
            request,
            "egress.html",
            run=found,
            events=events,
            counts=counts,
            decision=decision,
            later=later,
            notes=notes.lines,
        )

    # --- costs, graduation, queue, incidents ----------------------------------------------

    def costs(self, request: Request) -> Response:
        notes = Notes()
        chosen = request.query_params.get("kind") or None
        charts: list[dict[str, Any]] = []
        history: list[dict[str, Any]] = []
        with self.store() as store:
            kinds = queries.cost_kinds(store, notes) if store is not None else []
            if chosen is None and kinds:
                chosen = max(kinds, key=lambda k: int(k["runs"]))["kind"]
            if store is not None and chosen:
                history = queries.cost_history(store, notes, chosen)
        if history:
            charts = _cost_charts(history)
        return self.page(
            request,
            "costs.html",
            kinds=kinds,
            chosen=chosen,
            charts=charts,
            history=list(reversed(history[-20:])),
            notes=notes.lines,
        )

    def graduation(self, request: Request) -> Response:
        notes = Notes()
        with self.store() as store:
            found = (
                queries.graduation(store, notes, self.config.knobs)
                if store is not None
                else {"categories": [], "events": [], "knobs": self.config.knobs.to_json()}
            )
        return self.page(request, "graduation.html", graduation=found, notes=notes.lines)

    def queue(self, request: Request) -> Response:
        with self.store() as store:
            found = queries.team(store) if store is not None else None
        return self.page(request, "queue.html", team=found)

    def incidents(self, request: Request) -> Response:
        notes = Notes()
        with self.store() as store:
            found = queries.incidents(store, notes) if store is not None else []
        return self.page(request, "incidents.html", incidents=found, notes=notes.lines)

    # --- approvals -----------------------------------------------------------------------

    def approvals(self, request: Request) -> Response:
        notes = Notes()
        with self.store() as store:
            if store is None:
                pending, sessions, log = [], [], []
            else:
                now = self.config.clock.now()
                pending = queries.pending_questions(store, notes, now)
                sessions = [
                    {**found, "plan": _plan_text(store, notes, found)}
                    for found in queries.waiting_sessions(store, notes)
                ]
                log = queries.decisions(store, notes)
        return self.page(
            request,
            "approvals.html",
            pending=pending,
            sessions=sessions,
            log=log,
            operators=sorted(self.config.operators),
            said=request.query_params.get("said", ""),
            notes=notes.lines,
        )

    async def _answer_form(self, request: Request) -> dict[str, str] | Response:
        """The checked form of an answer (``--allow-approvals``, same origin, CSRF, bounded),
        or the response refusing it."""
        if self.config.approver is None:
            return PlainTextResponse(
                "this console is read-only: start it with --allow-approvals to answer",
                status_code=403,
            )
        session: Session = request.scope["state"]["session"]
        if not _same_origin(request.headers, self.config.origin):
            return PlainTextResponse("refused: a request from another site", status_code=403)
        body = await request.body()
        if len(body) > FORM_BYTES:
            return PlainTextResponse("form too large", status_code=413)
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items() if v}
        if not csrf_ok(session, form.get("csrf", "")):
            return PlainTextResponse("refused: missing or forged CSRF token", status_code=403)
        if form.get("answer") not in ("approve", "deny"):
            return PlainTextResponse("answer must be approve or deny", status_code=400)
        return form

    async def answer(self, request: Request) -> Response:
        """Approve or deny one mid-run question (``--allow-approvals`` only)."""
        form = await self._answer_form(request)
        if isinstance(form, Response):
            return form
        request_id = request.path_params["request"]
        approved = form["answer"] == "approve"
        return await _in_thread(lambda: self._record(request_id, approved))

    async def answer_session(self, request: Request) -> Response:
        """Approve or deny a cockpit session waiting for its first approval, bound to the
        session id and the plan fingerprint the page showed (``--allow-approvals`` only):
        approved, the session's cockpit starts it."""
        form = await self._answer_form(request)
        if isinstance(form, Response):
            return form
        session_id = request.path_params["session"]
        approved = form["answer"] == "approve"
        fingerprint = form.get("fingerprint", "")
        approver = self.config.approver
        assert approver is not None  # checked by _answer_form

        def record() -> Response:
            try:
                said = Registry(self.config.location, self.config.clock).answer_elsewhere(
                    session_id, fingerprint=fingerprint, approved=approved, who=approver, via="web"
                )
            except KaguraError as exc:
                return PlainTextResponse(f"not recorded: {exc.message}", status_code=500)
            return RedirectResponse("/approvals?" + urlencode({"said": said}), status_code=303)

        return await _in_thread(record)

    def _record(self, request_id: str, approved: bool) -> Response:
        notes = Notes()
        with self.store() as store:
            found = (
                queries.question(store, notes, self.config.clock.now(), request_id)
                if store is not None
                else None
            )
        if found is None:
            said = f"{request_id}: no open question (answered already, lapsed, or its run ended)"
            return RedirectResponse("/approvals?" + urlencode({"said": said}), status_code=303)
        approver = self.config.approver
        assert approver is not None  # checked by answer()
        try:
            with StateStore(self.config.location) as store:
                asked = Asked(request_id, str(found["category"]), str(found["fingerprint"]))
                decision = record_answer(
                    store,
                    asked,
                    approved=approved,
                    who=approver,
                    via="web",
                    clock=self.config.clock,
                    reason="answered in the web console",
                )
        except KaguraError as exc:
            return PlainTextResponse(f"not recorded: {exc.message}", status_code=500)
        said = f"{request_id} {decision.category} {decision.outcome} by {decision.who}"
        return RedirectResponse("/approvals?" + urlencode({"said": said}), status_code=303)

    def _missing(self) -> str | None:
        location = self.config.location
        if isinstance(location, Path) and not location.is_file():
            return f"no state store at {location} yet: nothing has been applied here"
        return None


async def _in_thread(work: Callable[[], Response]) -> Response:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(work)


@dataclass(frozen=True)
class _RunView:
    """What a run's page shows besides its row."""

    entries: list[timeline.Entry]
    phases: list[timeline.Phase]
    counts: dict[str, int]
    journal_total: int
    journal_shown: int
    evidence: list[dict[str, Any]]
    open: bool
    version: str

    @classmethod
    def read(cls, store: StateStore, notes: Notes, run: dict[str, Any]) -> _RunView:
        run_id = str(run["run_id"])
        items = queries.journal(store, notes, run_id)
        total = queries.journal_count(store, notes, run_id)
        events = queries.egress_latest(store, notes, run_id)
        counts = queries.egress_counts(store, notes, run_id)
        found_evidence = queries.evidence(store, notes, run_id)
        journal_entries = timeline.journal_entries(items)
        entries = timeline.merged(
            journal_entries,
            timeline.lease_entries(queries.leases(store, notes, run_id)),
            timeline.egress_entries(events),
            timeline.request_entries(queries.amendments(store, notes, run_id)),
            timeline.incident_entries(queries.incidents(store, notes, run_id)),
            timeline.evidence_entries(found_evidence),
        )
        ended = run.get("ended_at")
        return cls(
            entries=entries,
            phases=timeline.phases(journal_entries, ended),
            counts=counts,
            journal_total=total,
            journal_shown=len(items),
            evidence=found_evidence,
            open=ended is None,
            version=f"{total}:{sum(counts.values())}:{len(entries)}:{ended or ''}",
        )


def _cost_charts(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cost, turns and wall time per run of one task kind, against what each run's plan
    carried: the budget it was held to, and the forecast learnt from its kind's history
    (turns from the model calls the proxy counted, wall time from the host's clock; the
    dollars and turns engines reported are shown as reported, never learnt)."""
    labels = [_when(row["started_at"])[:16] for row in history]

    def forecast(row: dict[str, Any], part: str, dim: str) -> float | None:
        found = (row.get("budget") or {}).get("forecast") or {}
        return _number((found.get(part) or {}).get(dim))

    def held(row: dict[str, Any], dim: str) -> float | None:
        return _number((row.get("budget") or {}).get(dim))

    def series(name: str, values: list[float | None], kind: str) -> Series:
        return Series(name, values, kind, points=kind in ("actual", "counted"))

    cost = [
        series("cost (reported)", [_number(r.get("cost_usd")) for r in history], "actual"),
        series("history: engines reported (median)",
               [forecast(r, "reported", "cost_usd") for r in history], "expected"),
        series("budget held to", [held(r, "cost_usd") for r in history], "limit"),
    ]  # fmt: skip
    turns = [
        series("turns (reported)", [_number(r.get("turns")) for r in history], "actual"),
        series("model calls (counted at the proxy)",
               [_number(r.get("model_calls")) for r in history], "counted"),
        series("forecast: expected", [forecast(r, "expected", "turns") for r in history],
               "expected"),
        series("budget held to", [held(r, "turns") for r in history], "limit"),
    ]  # fmt: skip
    wall = [
        series("wall time", [_number(r.get("seconds")) for r in history], "actual"),
        series("forecast: expected", [forecast(r, "expected", "wall_seconds") for r in history],
               "expected"),
        series("budget held to", [held(r, "wall_seconds") for r in history], "limit"),
    ]  # fmt: skip
    return [
        {
            "title": title,
            "svg": Markup(line_chart(title, labels, found, unit)),
            "legend": legend(found),
        }
        for title, found, unit in (
            ("Cost per run (USD)", cost, ""),
            ("Turns per run", turns, ""),
            ("Wall time per run (s)", wall, "s"),
        )
    ]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _same_origin(headers: Any, origin: str) -> bool:
    """Whether the browser says the request comes from the console's own page. Under
    ``Referrer-Policy: no-referrer`` a form's ``Origin`` is ``null`` even from the console
    itself, so the browser's ``Sec-Fetch-Site`` decides where it is sent, and an
    ``Origin`` that names a site must name this one."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    named = headers.get("origin")
    return named is None or named == "null" or named == origin


def _plan_text(store: StateStore, notes: Notes, session: dict[str, Any]) -> str:
    """A waiting session's plan as the cockpit posted it, then its changes against the plan
    last applied for its task (the cockpit's saved file; or why it cannot be shown)."""
    path = str(session.get("plan_path") or "")
    try:
        plan = planfile.load(Path(path))
    except (KaguraError, OSError, ValueError) as exc:
        return f"(the plan file {path} cannot be shown: {exc})"
    text = render_text(plan, Style(False)).rstrip()
    last = queries.last_applied_plan(store, notes, plan["task"]["name"])
    changes = diff_plans(last, plan) if last is not None else []
    if last is None:
        return text + "\n  no plan of this task was applied here before"
    if not changes:
        return text + "\n  no changes against the last applied plan"
    return "\n".join(
        [text, "  changes against the last applied plan:"]
        + ["    " + change.render() for change in changes]
    )


def _cursor(text: str) -> tuple[str, str] | None:
    started, bar, run_id = text.partition("|")
    return (started[:64], run_id[:64]) if bar and started and run_id else None


def _int(text: str) -> int:
    return int(text) if text.isdigit() and len(text) < 12 else 0


def create_app(config: ConsoleConfig, sessions: Sessions) -> Any:
    """The ASGI application: the console's routes behind its Guard."""
    console = Console(config, sessions)
    app = Starlette(
        routes=[
            Route("/login", console.login),
            Route("/favicon.ico", lambda _request: Response(status_code=204)),
            Route("/", console.runs),
            Route("/runs/{run_id}", console.run),
            Route("/runs/{run_id}/live", console.run_live),
            Route("/runs/{run_id}/egress", console.egress),
            Route("/costs", console.costs),
            Route("/graduation", console.graduation),
            Route("/queue", console.queue),
            Route("/incidents", console.incidents),
            Route("/approvals", console.approvals),
            Route("/approvals/{request}", console.answer, methods=["POST"]),
            Route("/sessions/{session}", console.answer_session, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
        ]
    )
    return Guard(app, sessions, port=config.port, loopback_only=config.loopback_only)
