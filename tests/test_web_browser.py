"""The web console in a real browser: Debian's chromium, driven by Playwright.

`kagura-agent web` runs as its own process over a state store written by the real
components (testing/web_scene.py: apply's sequence against the in-memory runtime, the
proxy log parser, the journal, the graduation ledger). The browser logs in with the URL
the console printed first, looks at the pages as an operator would, and makes the attacks
a browser can make: no token, a forged CSRF token, a cross-site form, agent-written markup.
The screenshots of the main pages in docs/web/ are made here: with
KAGURA_UPDATE_SCREENSHOTS=1 they replace docs/web/*.png (their pixels change with every
run's times and ids, so an ordinary run writes them to its own folder and only checks
they are PNG images of a full page).

Without chromium (or Playwright) these tests skip, and fail under KAGURA_REQUIRE_DOCKER=1
(CI installs chromium: scripts/ci-setup.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from resources import missing

from kagura_agent.apply.midrun.grants import announce
from kagura_agent.apply.records.journal import Journal
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.runs import close_run, new_run_id, open_run
from kagura_agent.approvals import history, operator_name
from kagura_agent.approvals.midrun import Answer, ChatAsker, Question
from kagura_agent.brain.events import (
    DoneEvent,
    ToolCallEvent,
)
from kagura_agent.clock import SystemClock, iso
from kagura_agent.cockpit.registry import Registry, Session, new_session_id
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.plan import planfile
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore
from testing.web_scene import Scene, proxy_decisions, squid_line

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "docs" / "web"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# One browser and one demo store (module fixtures) for the module: on one xdist worker,
# not started again on each worker a test lands on.
pytestmark = pytest.mark.xdist_group("web-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        missing("Debian's chromium is not installed (scripts/ci-setup.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (bash scripts/install.sh dev)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield launched
        launched.close()


@dataclass
class World:
    scene: Scene
    state_dir: Path
    env: dict[str, str]
    runs: dict[str, str]  # name -> run id
    plan: Plan  # a plan of the scene, for runs made by hand


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """The demo store (testing/web_scene.seed_demo), written by its own process: apply
    wants the main thread and its own event loop, and Playwright's sync API holds one."""
    base = tmp_path_factory.mktemp("web")
    state_dir = base / "state"
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state_dir), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "testing.web_scene", str(base)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KAGURA_AGENT_STATE_DIR", str(state_dir))
        plan = Scene(base).plan("live-run", "live")
    return World(Scene(base), state_dir, env, runs, plan)


@dataclass
class Console:
    url: str  # the login URL it printed
    base: str
    process: subprocess.Popen[str]


def _start(world: World, *extra: str) -> Iterator[Console]:
    argv = [sys.executable, "-m", "kagura_agent", "web", "--port", "0"]
    argv += ["--manifests", str(world.scene.manifests()), *extra]
    process = subprocess.Popen(
        argv, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    out = process.stdout
    assert out is not None
    threading.Thread(target=lambda: lines.put(out.readline()), daemon=True).start()
    try:
        url = lines.get(timeout=30).strip()
    except queue.Empty:
        process.kill()
        pytest.fail(
            f"the console printed no URL: {process.stderr.read() if process.stderr else ''}"
        )
    assert url.startswith("http://127.0.0.1:") and "/login?token=" in url, url
    try:
        yield Console(url, url.split("/login", 1)[0], process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture()
def console(world: World) -> Iterator[Console]:
    yield from _start(world)


@pytest.fixture()
def approving_console(world: World) -> Iterator[Console]:
    yield from _start(world, "--allow-approvals")


def _page(browser: Any, console: Console) -> Any:
    """A logged-in page (a fresh browser context: its own cookies)."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    response = page.goto(console.url)
    assert response is not None and response.ok
    assert page.url == console.base + "/"  # the token is gone from the address bar
    return page


def _shot(page: Any, name: str) -> None:
    if os.environ.get("KAGURA_UPDATE_SCREENSHOTS") == "1":
        folder = SHOTS
    else:
        folder = Path(tempfile.gettempdir()) / f"kagura-shots-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    data = page.screenshot(path=str(folder / name), full_page=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


# --- the pages -------------------------------------------------------------------------


def test_the_runs_list_filters_and_links_to_each_run(
    browser: Any, world: World, console: Console
) -> None:
    page = _page(browser, console)
    rows = page.locator("table.runs tbody tr")
    assert rows.count() == 6
    assert page.locator("table.runs a", has_text=world.runs["hostile"]).count() == 1
    page.select_option("select[name=outcome]", "failed")
    page.click("form.filters button")
    assert page.locator("table.runs tbody tr").count() == 1
    assert page.locator("table.runs tbody tr td").nth(1).inner_text() == "release-notes"
    page.goto(console.base + "/")
    page.select_option("select[name=kind]", "docs")
    page.click("form.filters button")
    assert page.locator("table.runs tbody tr").count() == 5
    page.goto(console.base + "/")
    _shot(page, "runs.png")
    page.click(f"text={world.runs['docs-4']}")
    assert page.url == f"{console.base}/runs/{world.runs['docs-4']}"
    timeline = page.locator("ol.timeline")
    assert timeline.locator("li[data-kind='tool call']").count() == 1
    assert timeline.locator("li[data-kind='denied']", has_text="exfil.example.net").count() == 1
    assert timeline.locator("li[data-kind='minted']").count() == 0  # this task leases nothing
    assert page.locator("ol.phases li").count() >= 4
    assert "host-not-listed" in timeline.inner_text()
    _shot(page, "run.png")


def test_a_live_runs_timeline_updates_while_the_page_is_open(
    browser: Any, world: World, console: Console
) -> None:
    """The run is written by the real writers while the page is open: its row opened
    (apply/records/runs.open_run), its live view's journal, the proxy's decisions, then its
    close."""
    clock = SystemClock()
    run_id = new_run_id()
    with StateStore(store_location(world)) as store:
        open_run(store, world.plan, run_id, clock)
    live = LiveView(Redactor(), stream=open(os.devnull, "w"))  # noqa: SIM115 - closed below
    kept = Journal(store_location(world), run_id, clock)
    live.keep = kept.record
    try:
        live.phase("starting container from kagura/agent:0.1.0")
        page = _page(browser, console)
        page.goto(f"{console.base}/runs/{run_id}")
        assert page.locator("#status").inner_text() == "running"
        page.wait_for_selector("li[data-kind=phase]:has-text('starting container')")
        assert page.locator("li[data-kind='tool call']").count() == 0
        live.brain(ToolCallEvent(id="c1", name="bash", input={"argv": ["bash", "-c", "make docs"]}))
        page.wait_for_selector("li[data-kind='tool call']:has-text('make docs')", timeout=10_000)
        with StateStore(store_location(world)) as store:
            now = time.time()
            line = squid_line(now, "CONNECT", "evil.example.org", 443, status=403,
                              squid_status="TCP_DENIED")  # fmt: skip
            proxy_decisions(store, world.plan, run_id, iso(clock.now()), [line])
        page.wait_for_selector("li[data-kind=denied]:has-text('evil.example.org')", timeout=10_000)
        live.brain(DoneEvent(result="made"))
        live.phase("verifying: 1 command(s) in a fresh container")
    finally:
        live.keep = None
        kept.close()
        live.out.close()
    with StateStore(store_location(world)) as store:
        close_run(store, run_id, "success", 0, clock, turns=1, model_calls=1, cost_usd=0.01)
    page.wait_for_selector("#status:has-text('success')", timeout=10_000)
    assert page.locator("li[data-kind=phase]").count() == 2
    assert page.locator("#live").get_attribute("data-open") == "0"  # it stops polling


def store_location(world: World) -> Path:
    return world.state_dir / "state.db"


def test_the_cost_chart_shows_each_run_against_its_forecast(
    browser: Any, world: World, console: Console
) -> None:
    page = _page(browser, console)
    page.click("nav >> text=Costs")
    assert page.locator(".kinds a.here").inner_text().startswith("docs")
    charts = page.locator("svg.chart")
    assert charts.count() == 3
    cost = charts.nth(0)
    # One point per run of the kind and, from the second run on, the median its kind's
    # history reported (the script brain has no dollar budget: no limit line).
    assert cost.locator("g.actual circle").count() == 5
    assert cost.locator("g.expected polyline").count() == 1
    assert cost.locator("g.limit polyline").count() == 0
    # Wall time is learnt from the host's clock: the expected line from the second run, and
    # the budget each run was held to (the default, then the learnt limit from the fourth).
    wall = charts.nth(2)
    assert wall.locator("g.expected polyline").count() == 1
    assert wall.locator("g.limit polyline").count() == 1
    box = cost.bounding_box()
    assert box is not None and box["width"] > 400 and box["height"] > 100  # rendered
    assert "of 4 runs" in page.locator("table").inner_text()
    _shot(page, "costs.png")


def test_graduation_shows_evidence_knobs_unmet_and_demotions(
    browser: Any, world: World, console: Console
) -> None:
    page = _page(browser, console)
    page.click("nav >> text=Graduation")
    rows = page.locator("table.graduation tbody tr")
    assert rows.count() == 2
    github = page.locator("table.graduation tr", has_text="egress:github")
    assert "locked" in github.inner_text()
    assert github.locator(".unmet").count() >= 1  # one success since the demotion
    events = page.locator("table").nth(1)
    assert events.locator("tr.demoted").count() == 2
    _shot(page, "graduation.png")


def test_the_team_queue_and_incidents_pages_say_what_this_store_has(
    browser: Any, world: World, console: Console
) -> None:
    page = _page(browser, console)
    page.click("nav >> text=Team queue")
    assert "embedded SQLite" in page.locator("main").inner_text()
    page.click("nav >> text=Incidents")
    assert page.locator("main").inner_text().count("no incidents recorded") == 1


# --- approvals ---------------------------------------------------------------------------


def _ask_in_background(world: World, request: str) -> tuple[threading.Thread, list[Answer], str]:
    """A run (its row open) whose live view asks a mid-run question the way apply does
    under serve (ChatAsker → announce → the ask event, kept in the journal); the asker
    waits in a thread for the answer it reads from the approval log."""
    clock = SystemClock()
    run_id = new_run_id()
    with StateStore(store_location(world)) as store:
        open_run(store, world.plan, run_id, clock)
    fingerprint = "sha256:" + "c" * 64
    answers: list[Answer] = []

    def ask() -> None:
        live = LiveView(Redactor(), stream=open(os.devnull, "w"))  # noqa: SIM115
        kept = Journal(store_location(world), run_id, clock)
        live.keep = kept.record
        question = Question(
            request,
            "egress:github",
            fingerprint,
            'The agent asks for egress:github ("to open a pull request").\n'
            "  egress.allow: + github.com:443/https",
            60.0,
        )
        try:
            with StateStore(store_location(world)) as store:
                asker = ChatAsker(announce(live))
                answers.append(asyncio.run(asker.ask(store, question, clock)))
        finally:
            kept.close()
            live.out.close()
            with StateStore(store_location(world)) as store:
                close_run(store, run_id, "success", 0, clock)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread, answers, fingerprint


def test_an_approval_round_trip(browser: Any, world: World, approving_console: Console) -> None:
    request = f"m-web{int(time.time() * 1000) % 10**8}-1"
    thread, answers, fingerprint = _ask_in_background(world, request)
    page = _page(browser, approving_console)
    page.click("nav >> text=Approvals")
    question = page.locator(f"article.question[data-request='{request}']")
    for _ in range(50):
        if question.count():
            break
        time.sleep(0.2)
        page.reload()
    assert "github.com:443" in question.locator("pre").inner_text()  # the plan diff
    _shot(page, "approvals.png")
    question.locator("button.approve").click()
    assert page.locator("p.said").inner_text() == (
        f"{request} egress:github approved by web:{operator_name()}"
    )
    thread.join(timeout=20)
    [answer] = answers
    assert (answer.approved, answer.who, answer.via) == (True, f"web:{operator_name()}", "web")
    with StateStore(store_location(world)) as store:
        decision = next(d for d in history(store) if d.request == request)
    assert (decision.fingerprint, decision.category) == (fingerprint, "egress:github")
    # Answered: the question is gone from the page.
    page.goto(approving_console.base + "/approvals")
    assert page.locator(f"article.question[data-request='{request}']").count() == 0


def test_a_forged_csrf_token_and_a_cross_site_form_are_refused(
    browser: Any, world: World, approving_console: Console
) -> None:
    request = f"m-csrf{int(time.time() * 1000) % 10**8}-1"
    thread, answers, _ = _ask_in_background(world, request)
    page = _page(browser, approving_console)
    page.goto(approving_console.base + "/approvals")
    for _ in range(50):
        if page.locator(f"article.question[data-request='{request}']").count():
            break
        time.sleep(0.2)
        page.reload()
    # The page's own origin and cookie, but a forged token.
    status = page.evaluate(
        """async (request) => {
            const r = await fetch('/approvals/' + request, {method: 'POST',
              headers: {'content-type': 'application/x-www-form-urlencoded'},
              body: 'csrf=forged&answer=approve', redirect: 'manual'});
            return r.status;
        }""",
        request,
    )
    assert status == 403
    # A form on another site, posting to the console with the real field names.
    other = page.context.new_page()
    other.set_content(
        f'<form method="post" action="{approving_console.base}/approvals/{request}">'
        '<input name="csrf" value="x"><input name="answer" value="approve"></form>'
    )
    with other.expect_navigation():
        other.evaluate("document.forms[0].submit()")
    assert "approved" not in other.content()
    assert other.locator("body").inner_text().startswith(("not logged in", "refused"))
    with StateStore(store_location(world)) as store:
        assert [d for d in history(store) if d.request == request] == []
    assert answers == []  # still waiting: nothing approved it
    # Answer it for real (denied) so the asking thread ends.
    page.reload()
    page.locator(f"article.question[data-request='{request}'] button.deny").click()
    thread.join(timeout=20)
    assert [a.outcome for a in answers] == ["denied"]


def _waiting_session(world: World, name: str, plan: Plan | None = None) -> Session:
    """A cockpit session waiting for its first approval, as `serve` leaves it: its plan
    (the world's unless given) saved beside the store, the row in cockpit_sessions."""
    plan = plan or world.plan
    clock = SystemClock()
    registry = Registry(store_location(world), clock)
    session_id = new_session_id()
    plan_path = world.state_dir / f"{name}-{session_id}.json"
    planfile.save(plan, plan_path)
    now = iso(clock.now())
    session = Session(
        id=session_id,
        transport="slack",
        thread="C1:1.1",
        requested_by="U-alice",
        task_path=str(plan["task"]["path"]),
        task_name=plan["task"]["name"],
        fingerprint=plan["intent"],
        plan_path=str(plan_path),
        needs="egress:docs-site",
        state="awaiting-approval",
        created_at=now,
        updated_at=now,
        asked_at=now,
    )
    registry.add(session)
    return session


@pytest.mark.usefixtures("without_docker")
def test_a_waiting_cockpit_session_is_answered_with_its_plan_in_view(
    browser: Any, world: World, approving_console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(world.state_dir))
    # A task the scene applied before: the page shows the plan against that one.
    again = world.scene.plan("docs-refresh", "docs", ["echo again > out.txt"])
    session = _waiting_session(world, "approve", again)
    page = _page(browser, approving_console)
    page.goto(approving_console.base + "/approvals")
    shown = page.locator(f"article.session[data-session='{session.id}']")
    plan_text = shown.locator("pre").inner_text()
    assert f"Plan for task {session.task_name}" in plan_text, plan_text
    assert "docs.example.test" in plan_text  # what it would be allowed to reach
    assert "changes against the last applied plan" in plan_text
    assert "no plan of this task was applied here before" not in plan_text
    # A forged fingerprint (a plan other than the one shown) records nothing.
    said = page.evaluate(
        """async ([id, csrf]) => {
            const r = await fetch('/sessions/' + id, {method: 'POST',
              headers: {'content-type': 'application/x-www-form-urlencoded'},
              body: 'csrf=' + csrf + '&answer=approve&fingerprint=sha256:00'});
            return await r.text();
        }""",
        [session.id, page.locator("input[name=csrf]").first.get_attribute("value")],
    )
    assert "nothing recorded" in said, said
    forged = page.evaluate(
        """async (id) => (await fetch('/sessions/' + id, {method: 'POST',
              headers: {'content-type': 'application/x-www-form-urlencoded'},
              body: 'csrf=forged&answer=approve&fingerprint=x', redirect: 'manual'})).status""",
        session.id,
    )
    assert forged == 403
    registry = Registry(store_location(world), SystemClock())
    assert registry.get(session.id).state == "awaiting-approval"  # type: ignore[union-attr]
    shown.locator("button.approve").click()
    who = f"web:{operator_name()}"
    assert page.locator("p.said").inner_text() == f"session {session.id} approved by {who}"
    # Queued for its cockpit to start; the decision bound to the session and the plan.
    assert registry.get(session.id).state == "queued"  # type: ignore[union-attr]
    with StateStore(store_location(world)) as store:
        [decision] = [d for d in history(store) if d.request == session.id]
    assert (decision.who, decision.via, decision.fingerprint, decision.category) == (
        who,
        "web",
        session.fingerprint,
        "egress:docs-site",
    )
    assert page.locator(f"article.session[data-session='{session.id}']").count() == 0
    denied = _waiting_session(world, "deny")
    page.goto(approving_console.base + "/approvals")
    page.locator(f"article.session[data-session='{denied.id}'] button.deny").click()
    assert page.locator("p.said").inner_text() == f"session {denied.id} denied by {who}"
    assert registry.get(denied.id).state == "denied"  # type: ignore[union-attr]


def test_a_read_only_console_shows_waiting_sessions_without_buttons(
    browser: Any, world: World, console: Console
) -> None:
    session = _waiting_session(world, "readonly")
    page = _page(browser, console)
    page.goto(console.base + "/approvals")
    shown = page.locator(f"article.session[data-session='{session.id}']")
    assert shown.count() == 1 and shown.locator("button").count() == 0


# --- what a browser without the token, and the agent's writing, can do -------------------


def test_without_the_token_every_page_is_401(browser: Any, console: Console) -> None:
    context = browser.new_context()
    page = context.new_page()
    for path in ("/", "/runs/run-x", "/costs", "/graduation", "/queue", "/approvals"):
        response = page.goto(console.base + path)
        assert response is not None and response.status == 401, path
        assert "not logged in" in page.inner_text("body")
    wrong = page.goto(console.base + "/login?token=guessed")
    assert wrong is not None and wrong.status == 401
    # The real token works once; a second browser cannot use it again.
    first = _page(browser, console)
    headers = first.context.cookies()
    [cookie] = headers
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    again = context.new_page().goto(console.url)
    assert again is not None and again.status == 401
    # The session cookie is not readable by script.
    assert first.evaluate("document.cookie") == ""


def test_agent_written_markup_is_shown_as_inert_text(
    browser: Any, world: World, console: Console
) -> None:
    page = _page(browser, console)
    response = page.goto(f"{console.base}/runs/{world.runs['hostile']}")
    assert response is not None
    headers = response.headers
    assert "'unsafe-inline'" not in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    text = page.locator("li[data-kind='agent text'] pre").inner_text()
    assert "<script>window.__pwned = 1</script>" in text
    assert '<img src=x onerror="window.__pwned = 2">' in text
    assert "\\x1b[2J\\x1b[31mred and cleared" in text  # the escape shown, not acted on
    assert "sk-ant-api03" not in page.content()  # a key-shaped string is redacted
    assert "(redacted: looks like a secret)" in text
    assert page.evaluate("window.__pwned") is None
    assert page.locator("ol.timeline img, ol.timeline script").count() == 0
