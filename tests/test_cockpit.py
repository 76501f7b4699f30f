"""The serve cockpit: intents, the operator gate, sessions that survive a restart, and
the whole chat path — launch, approve / deny / silence, progress, kill — through real
``apply`` processes and real containers (a scripted in-memory transport stands in for
the chat; tests/test_cockpit_slack.py drives Slack itself)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, leftovers, make_project, manifest_set, run_ids, write_task
from chat_helpers import CANARY, LEASED, LEASED_SPEC

from kagura_agent import approvals
from kagura_agent.clock import SystemClock
from kagura_agent.cockpit.core import Cockpit, CockpitConfig
from kagura_agent.cockpit.intents import classify
from kagura_agent.cockpit.registry import Registry, Session
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import KaguraError
from kagura_agent.state import Location, StateStore, open_store

ALICE, MALLORY = "U-alice", "U-mallory"
THREAD = "C1:100.1"


class ScriptedTransport:
    """Events in through :meth:`send`; everything the cockpit posts kept in order."""

    name = "test"
    max_chars = 1000
    post_interval = 0.0

    def __init__(self) -> None:
        self.inbox: queue.Queue[Event | None] = queue.Queue()
        # (kind, thread, text); kind say | ask | stop | attach
        self.posts: list[tuple[str, str, str]] = []
        self.requests: list[str] = []
        self.stops: list[str] = []  # the sessions offered a ❌ Stop button
        self.files: list[tuple[str, str, str]] = []  # (filename, content, comment)
        self._changed = threading.Condition()

    def run(self, handle: Any) -> None:
        while (event := self.inbox.get()) is not None:
            handle(event)

    def stop(self) -> None:
        self.inbox.put(None)

    def say(self, thread: str, text: str) -> None:
        with self._changed:
            self.posts.append(("say", thread, text))
            self._changed.notify_all()

    def ask(self, thread: str, text: str, request: str) -> None:
        with self._changed:
            self.posts.append(("ask", thread, text))
            self.requests.append(request)
            self._changed.notify_all()

    def offer_stop(self, thread: str, text: str, request: str) -> None:
        with self._changed:
            self.posts.append(("stop", thread, text))
            self.stops.append(request)
            self._changed.notify_all()

    def attach(self, thread: str, filename: str, content: str, comment: str) -> None:
        with self._changed:
            self.posts.append(("attach", thread, comment))
            self.files.append((filename, content, comment))
            self._changed.notify_all()

    def send(
        self, text: str = "", *, user: str = ALICE, action: str = "", request: str = ""
    ) -> None:
        self.inbox.put(Event("test", user, THREAD, text=text, action=action, request=request))

    def text(self) -> str:
        with self._changed:
            return "\n".join(text for _, _, text in self.posts)

    def wait_for(self, needle: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while needle not in "\n".join(text for _, _, text in self.posts):
                left = deadline - time.monotonic()
                assert left > 0, f"never posted {needle!r}; posted:\n{self.text_unlocked()}"
                self._changed.wait(left)
        return self.text()

    def text_unlocked(self) -> str:
        return "\n".join(text for _, _, text in self.posts)


@pytest.fixture()
def cockpit_world(state_dir: Path, tmp_path: Path) -> Any:
    """A cockpit serving a scripted transport in a thread, stopped (and awaited) after."""
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "EgressPolicy",
            "metadata": {"name": "docs"},
            "spec": {"allow": [{"host": "docs.invalid"}]},
        },
    )
    transport = ScriptedTransport()
    started: list[Cockpit] = []

    def start(**config: Any) -> Cockpit:
        cockpit = Cockpit(
            transport,
            CockpitConfig(operators=frozenset({ALICE}), manifests=str(manifests), **config),
        )
        cockpit.settle_previous()  # as `serve` does before it listens
        thread = threading.Thread(target=cockpit.serve, daemon=True)
        thread.start()
        started.append(cockpit)
        cockpit.thread = thread  # type: ignore[attr-defined]
        return cockpit

    yield transport, start, tmp_path, state_dir
    for cockpit in started:
        transport.stop()
        cockpit.thread.join(60)  # type: ignore[attr-defined]
        assert not cockpit.thread.is_alive()  # type: ignore[attr-defined]


def _task(base: Path, name: str, steps: list[str], **spec: Any) -> Path:
    project = make_project(base, name)
    return write_task(project, name, {"steps": steps, "verify": ["true"], **spec})


# --- intents and the gate (no Docker) ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "argument", "problem"),
    [
        ("launch a/task.yml", "launch", "a/task.yml", ""),
        ("run list the  files", "run", "list the files", ""),
        ("APPLY a.yml", "launch", "a.yml", ""),
        ("plan a.yml", "plan", "a.yml", ""),
        ("status", "status", "", ""),
        ("kill s-abc123", "kill", "s-abc123", ""),
        ("say s-abc123 also the README", "say", "s-abc123 also the README", ""),
        ("say s-abc123", "say", "", "say needs a session and the text to send it"),
        ("approve s-1", "approve", "s-1", ""),
        ("", "help", "", ""),
        ("launch", "launch", "", "launch needs an argument"),
        ("status now", "status", "", "status takes no argument"),
        ("please rm -rf /", "unknown", "", "unknown command 'please'"),
    ],
)
def test_intents_are_structural(text: str, kind: str, argument: str, problem: str) -> None:
    intent = classify(Event("test", ALICE, THREAD, text=text))
    assert (intent.kind, intent.argument, intent.problem) == (kind, argument, problem)


def test_buttons_are_intents() -> None:
    assert classify(Event("t", ALICE, THREAD, action="approve", request="s-1")).kind == "approve"
    assert classify(Event("t", ALICE, THREAD, action="deny", request="s-1")).kind == "deny"
    assert classify(Event("t", ALICE, THREAD, action="launch", request="x")).kind == "unknown"


def test_non_operators_are_refused_and_nothing_is_stored(
    cockpit_world: Any, state_dir: Path
) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "gate", ["true"])
    cockpit = start()
    for text in (f"launch {task}", f"plan {task}", "status", "kill s-1", "approve s-1"):
        transport.send(text, user=MALLORY)
    transport.send("help", user=MALLORY)
    out = transport.wait_for("commands:")
    assert out.count("only this cockpit's operators may") == 5
    assert cockpit.sessions() == []
    assert run_ids(state_dir) == []


def test_mistakes_get_answers_not_tracebacks(cockpit_world: Any, tmp_path: Path) -> None:
    transport, start, _, _ = cockpit_world
    start()
    bad = tmp_path / "bad.yml"
    bad.write_text("apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: x}\nspec: {nope: 1}\n")
    transport.send(f"launch {tmp_path / 'absent.yml'}")
    transport.send(f"plan {bad}")
    transport.send("approve s-000000")
    transport.send("frobnicate")
    out = transport.wait_for("unknown command 'frobnicate'")
    assert "absent.yml does not exist" in out
    assert "bad.yml:4" in out and "validation error" in out
    assert "no session s-000000" in out
    assert "Traceback" not in out


def test_only_run_sessions_continue(cockpit_world: Any, state_dir: Path) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "filed", ["true"])
    registry = Registry(state_dir / "state.db", SystemClock())
    registry.add(Session(id="s-file", state="succeeded", **{**_ROW, "task_path": str(task)}))
    start()
    transport.send("continue s-file more please")
    transport.send("continue s-nope more please")
    transport.send("continue s-file")
    out = transport.wait_for("continue needs a session and the text to send it")
    assert "session s-file was a launch of a task file; only `run` sessions continue" in out
    assert "no session s-nope" in out
    assert run_ids(state_dir) == []


def test_registry_races_and_expiry(state_target: Location) -> None:
    registry = Registry(state_target, SystemClock())
    registry.add(Session(id="s-a", state="awaiting-approval", **_ROW))
    registry.add(Session(id="s-b", state="running", **_ROW))
    # Two answers at once: the second finds the state moved on.
    assert registry.update("s-a", expect="awaiting-approval", state="running")
    assert not registry.update("s-a", expect="awaiting-approval", state="denied")
    registry.update("s-a", state="awaiting-approval")
    assert [s.id for s in registry.expire_requests()] == ["s-a"]
    assert {s.id: s.state for s in registry.recent()} == {"s-a": "expired", "s-b": "running"}


_ROW = dict(
    transport="test", thread=THREAD, requested_by=ALICE, task_path="/x", task_name="x",
    fingerprint="sha256:" + "0" * 64, plan_path="/x.json", needs="egress:docs",
    created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z",
)  # fmt: skip


def test_a_restart_settles_runs_whose_apply_is_gone(
    cockpit_world: Any, state_target: Location
) -> None:
    """An apply that ended while no cockpit ran gets the outcome it recorded; one that was
    killed before it could record any is lost; a pending request lapses."""
    from kagura_agent.apply.records.runs import MIGRATIONS

    transport, start, _, _ = cockpit_world
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    registry = Registry(state_target, SystemClock())
    registry.add(Session(id="s-done", state="running", pid=pid, pid_start="t0", **_ROW))
    registry.add(Session(id="s-gone", state="running", pid=pid, pid_start="t1", **_ROW))
    registry.add(Session(id="s-ask", state="awaiting-approval", **_ROW))
    store = StateStore(state_target)
    store.migrate("runs", MIGRATIONS)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO runs (run_id, task, fingerprint, pid, pid_start, started_at, ended_at,"
            " outcome, exit_code) VALUES ('run-ended', 'x', 'f', ?, 't0', 'a', 'b', 'success', 0)",
            (pid,),
        )
    store.close()
    cockpit = start()
    out = transport.wait_for("session s-gone: apply lost (exit -1)")
    assert "session s-done: run run-ended succeeded (exit 0)" in out
    states = {s.id: (s.state, s.run_id) for s in cockpit.sessions()}
    assert states == {
        "s-done": ("succeeded", "run-ended"),
        "s-gone": ("lost", None),
        "s-ask": ("expired", None),
    }


# --- through real apply processes and containers ----------------------------------------


def test_launch_without_approval_runs_and_reports(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "quick", ["echo hello > out.txt"])
    cockpit = start()
    transport.send(f"launch {task}")
    out = transport.wait_for("succeeded in")
    out = transport.wait_for("(exit 0)")
    assert "session s-" in out and "fingerprint" in out  # the plan was shown first
    assert "▸ bash: echo hello > out.txt" in out
    (session,) = cockpit.sessions()
    assert (session.state, session.exit_code, session.requested_by) == ("succeeded", 0, ALICE)
    assert session.run_id in run_ids(state_dir)
    assert (task.parent / "out.txt").read_text() == "hello\n"
    assert leftovers(docker_client, session.run_id) == []
    transport.send("status")
    assert f"{session.id}  succeeded" in transport.wait_for(f"{session.id}  succeeded")


def test_approval_in_chat_is_logged_and_bound_to_the_plan(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "needs", ["true"], egress=["docs"])
    cockpit = start()
    transport.send(f"launch {task}")
    transport.wait_for("needs approval")
    (request,) = transport.requests
    assert [s.state for s in cockpit.sessions()] == ["awaiting-approval"]
    assert run_ids(state_dir) == []  # nothing runs before the answer
    transport.send(action="approve", request=request, user=MALLORY)
    transport.wait_for("only this cockpit's operators may approve")
    transport.send(action="approve", request=request)
    out = transport.wait_for("(exit 0)")
    assert f"session {request} approved by test:{ALICE}" in out
    (session,) = cockpit.sessions()
    decisions = approvals.history(open_store(), category="egress:docs")
    assert [(d.outcome, d.who, d.via, d.fingerprint) for d in decisions] == [
        ("approved", f"test:{ALICE}", "test", session.fingerprint)
    ]
    transport.send(action="approve", request=request)
    assert "is succeeded; nothing to answer" in transport.wait_for("nothing to answer")
    assert leftovers(docker_client, session.run_id or "") == []


def test_a_session_answered_in_the_web_console_starts_from_its_cockpit(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    """The web console answers a waiting session through the store (bound to its id and
    the plan fingerprint it showed); the cockpit that asked tells the thread and starts
    an approved one, and a denied one runs nothing."""
    transport, start, base, _ = cockpit_world
    task = _task(base, "webbed", ["true"], egress=["docs"])
    cockpit = start()
    registry = Registry(state_dir / "state.db", SystemClock())
    transport.send(f"launch {task}")
    transport.wait_for("needs approval")
    (request,) = transport.requests
    (session,) = cockpit.sessions()
    shown = session.fingerprint
    stale = "sha256:" + "0" * 64
    said = registry.answer_elsewhere(
        request, fingerprint=stale, approved=True, who="web:alice", via="web"
    )
    assert "nothing recorded" in said
    assert registry.get(request).state == "awaiting-approval"  # type: ignore[union-attr]
    said = registry.answer_elsewhere(
        request, fingerprint=shown, approved=True, who="web:alice", via="web"
    )
    assert said == f"session {request} approved by web:alice"
    out = transport.wait_for("(exit 0)")
    assert f"session {request} approved by web:alice in the web console; applying" in out
    decisions = approvals.history(open_store(), category="egress:docs")
    assert [(d.outcome, d.who, d.via, d.request, d.fingerprint) for d in decisions] == [
        ("approved", "web:alice", "web", request, shown)
    ]
    # Answered: neither the chat nor the console can answer it again.
    again = registry.answer_elsewhere(
        request, fingerprint=shown, approved=False, who="web:alice", via="web"
    )
    assert again.endswith("nothing to answer")
    transport.send(f"launch {task}")
    deadline = time.monotonic() + 60
    while len(transport.requests) < 2:
        assert time.monotonic() < deadline, transport.text()
        time.sleep(0.1)
    second = transport.requests[-1]
    asked = registry.get(second).fingerprint  # type: ignore[union-attr]
    assert (
        registry.answer_elsewhere(
            second, fingerprint=asked, approved=False, who="web:alice", via="web"
        )
        == f"session {second} denied by web:alice"
    )
    transport.wait_for(f"session {second} denied by web:alice in the web console; nothing ran")
    assert sorted(s.state for s in cockpit.sessions()) == ["denied", "succeeded"]
    assert len(run_ids(state_dir)) == 1


@pytest.mark.usefixtures("docker_client")
def test_deny_and_silence_run_nothing(cockpit_world: Any, state_dir: Path) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "denied", ["true"], egress=["docs"])
    cockpit = start(approval_timeout=1.0)
    transport.send(f"launch {task}")
    transport.wait_for("needs approval")
    transport.send(action="deny", request=transport.requests[0])
    transport.wait_for(f"denied by test:{ALICE}; nothing ran")
    transport.send(f"launch {task}")
    transport.wait_for("no answer within 1s; denied, nothing ran")
    states = sorted(s.state for s in cockpit.sessions())
    assert states == ["denied", "expired"]
    outcomes = sorted(d.outcome for d in approvals.history(open_store(), category="egress:docs"))
    assert outcomes == ["denied", "timeout"]
    assert run_ids(state_dir) == []


@pytest.mark.usefixtures("docker_client")
def test_a_plan_changed_after_the_request_is_refused_by_apply(
    cockpit_world: Any, state_dir: Path
) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "changed", ["true"], egress=["docs"])
    start()
    transport.send(f"launch {task}")
    transport.wait_for("needs approval")
    task.write_text(
        task.read_text().replace("- 'true'", "- echo changed").replace("- true", "- echo changed")
    )
    transport.send(action="approve", request=transport.requests[0])
    out = transport.wait_for("(exit 6)")
    assert "stale" in out or "changed" in out
    assert run_ids(state_dir) == []


def test_kill_interrupts_the_run_and_nothing_is_left(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "long", ["sleep 120"])
    cockpit = start()
    transport.send(f"launch {task}")
    transport.wait_for("▸ bash: sleep 120")
    (session,) = cockpit.sessions()
    transport.send(f"kill {session.id}")
    out = transport.wait_for("(exit 130)")
    assert f"session {session.id}: run run-" in out and " killed " in out
    (session,) = cockpit.sessions()
    assert session.state == "killed"
    (run_id,) = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


@pytest.mark.parametrize(
    ("transport", "message"),
    [
        ({"name": "absent"}, "no Transport named 'absent' (have: chat, dc, terminal)"),
        ({"name": "chat"}, "Transport chat lists no operators"),
        ({"name": "dc"}, "Transport dc (discord) needs spec.token"),
    ],
)
def test_serve_refuses_a_transport_it_cannot_serve(
    tmp_path: Path, state_dir: Path, transport: dict[str, str], message: str, capsys: Any
) -> None:
    from kagura_agent.cli import main as cli_main

    manifests = manifest_set(
        tmp_path,
        {
            "kind": "Transport",
            "metadata": {"name": "chat"},
            "spec": {"type": "slack", "token": "env:X_BOT", "app_token": "env:X_APP"},
        },
        {
            "kind": "Transport",
            "metadata": {"name": "dc"},
            "spec": {"type": "discord", "operators": ["1"]},
        },
    )
    argv = ["serve", "--manifests", str(manifests), "--transport", transport["name"]]
    assert cli_main.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.usefixtures("without_docker")
def test_a_request_the_chat_never_showed_still_lapses(cockpit_world: Any, state_dir: Path) -> None:
    transport, start, base, _ = cockpit_world

    def broken_ask(thread: str, text: str, request: str) -> None:
        raise KaguraError("chat.postMessage failed: channel_not_found")

    transport.ask = broken_ask
    task = _task(base, "unasked", ["true"], egress=["docs"])
    cockpit = start(approval_timeout=0.5)
    transport.send(f"launch {task}")
    out = transport.wait_for("no answer within 0.5s; denied, nothing ran")
    assert "channel_not_found" in out
    assert [s.state for s in cockpit.sessions()] == ["expired"]
    assert run_ids(state_dir) == []


def test_a_run_outlives_a_killed_cockpit_and_the_next_one_adopts_it(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "survivor", ["sleep 4", "echo done > done.txt"])
    serve = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "serve", "--manifests", str(base / "manifests")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        cwd=REPO,
    )
    assert serve.stdin is not None and serve.stdout is not None
    serve.stdin.write(f"launch {task}\n")
    serve.stdin.flush()
    seen = ""
    while "▸ bash: sleep 4" not in seen:
        line = serve.stdout.readline()
        assert line, seen
        seen += line
    serve.kill()  # kill -9: no clean-up of its own, its pipes break
    serve.wait()
    (run_id,) = run_ids(state_dir)
    cockpit = start()
    out = transport.wait_for("(exit 0)", timeout=120)
    assert "the cockpit restarted; still following its run" in out
    (session,) = cockpit.sessions()
    assert (session.state, session.run_id, session.exit_code) == ("succeeded", run_id, 0)
    assert (task.parent / "done.txt").read_text() == "done\n"  # the run went on to its end
    assert leftovers(docker_client, run_id) == []


def test_run_text_from_chat_is_a_one_off_task_with_the_llm_brain(
    cockpit_world: Any, docker_client: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run TEXT` writes the task `kagura-agent run "TEXT"` would (the default LLM brain,
    the text a value), in the configured project root; the sdk brain runs against the fake
    `claude` of the agent test image. The API key never reaches the chat."""
    from testing.agent_test_image import ensure_agent_test_image

    transport, _start, base, _ = cockpit_world
    api_key = "sk-ant-kagura-canary-" + "c" * 30
    monkeypatch.setenv("ANTHROPIC_API_KEY", api_key)
    image = ensure_agent_test_image(docker_client)
    manifests = manifest_set(
        base / "with-test-image",
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
    )
    project = make_project(base, "chat-project")
    cockpit = Cockpit(
        transport,
        CockpitConfig(
            operators=frozenset({ALICE}),
            manifests=str(manifests),
            project_root=project,
            image="agent-test",
        ),
    )
    thread = threading.Thread(target=cockpit.serve, daemon=True)
    thread.start()
    try:
        transport.send("run list the files here {{ not a template }}")
        out = transport.wait_for("(exit 0)", timeout=120)
        (first,) = cockpit.sessions()
        # A follow-up resumes the brain session the first run started (as `repl` does).
        transport.send(f"continue {first.id} and now the README")
        out = transport.wait_for("resuming session 'chat-", timeout=120)
        deadline = time.monotonic() + 120
        while transport.text().count("(exit 0)") < 2:
            assert time.monotonic() < deadline, transport.text()
            time.sleep(0.1)
    finally:
        transport.stop()
        thread.join(60)
    second, session = cockpit.sessions()  # newest first
    assert (session.state, second.state) == ("succeeded", "succeeded")
    assert session.task_name.startswith("run-list-the-files-here")
    assert second.task_name.startswith("run-and-now-the-readme")
    assert f"writes       {project} -> /workspace" in out
    assert "brain        claude (sdk" in out, out
    assert api_key not in transport.text()
    for done in (session, second):
        assert leftovers(docker_client, done.run_id or "") == []


# --- authority: chat tasks only request from the operator's manifest set ------------------


def test_a_chat_launch_of_a_task_file_carrying_a_provider_is_refused(
    cockpit_world: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task names its own static provider over the root secret: refused, located,
    nothing runs and the secret's value is never posted."""
    transport, start, base, _ = cockpit_world
    monkeypatch.setenv("CLOUDFLARE_ROOT_TOKEN", "canary-cockpit-0b7e4f")
    project = make_project(base, "rooted")
    task = project / "task.yml"
    task.write_text(
        "apiVersion: kagura.dev/v1\nkind: CredentialProvider\nmetadata: {name: rooted}\n"
        "spec:\n  type: static\n  standing: true\n  secret: env:CLOUDFLARE_ROOT_TOKEN\n"
        "  static: {env: TOKEN}\n  baseline_scopes: [all]\n  scopes: {all: {description: x}}\n"
        "---\napiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: rooted}\n"
        "spec:\n  credentials: [{provider: rooted, scope: all}]\n  steps: [env]\n"
    )
    cockpit = start()
    transport.send(f"launch {task}")
    out = transport.wait_for("validation error")
    assert "task.yml:2" in out and "a task file may only hold Task documents" in out
    assert "canary-cockpit-0b7e4f" not in out
    assert transport.requests == [] and cockpit.sessions() == []
    assert run_ids(state_dir) == []


@pytest.mark.usefixtures("docker_client")
def test_a_launch_that_needs_approval_always_shows_the_buttons(
    cockpit_world: Any, state_dir: Path
) -> None:
    """An operator allowlist that is not baseline: the plan message shows the layers and
    the approval is asked for with buttons; denying runs nothing."""
    transport, start, base, _ = cockpit_world
    task = _task(base, "asks", ["true"], egress=["docs"])
    start()
    transport.send(f"launch {task}")
    out = transport.wait_for("needs approval")
    assert "  manifests    packaged <packaged> + operator " in out
    assert "(policy docs)  (from operator)" in out
    assert [kind for kind, _, text in transport.posts if "egress:docs" in text][-1] == "ask"
    transport.send(action="deny", request=transport.requests[0])
    transport.wait_for("nothing ran")
    assert run_ids(state_dir) == []


# --- issue 13: kill from chat, output, concurrency ---------------------------------------


def test_the_stop_button_stops_a_run_and_the_thread_is_told_what_it_left(
    tmp_path: Path, state_dir: Path, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running session offers a ❌ Stop button; a non-operator's press is refused, the
    operator's is apply's SIGINT path: the leased credential is revoked, the agent, its
    proxy, network and volume are removed, and the thread says so (checked, not assumed)."""
    from apply_helpers import cli_env, live_leases

    monkeypatch.setenv("KAGURA_TEST_TOKEN", CANARY)
    manifests = manifest_set(tmp_path / "m", *LEASED)
    task = _task(tmp_path, "stoppable", ['test -n "$TEST_TOKEN"', "sleep 600"], **LEASED_SPEC)
    transport = ScriptedTransport()
    cockpit = Cockpit(
        transport, CockpitConfig(operators=frozenset({ALICE}), manifests=str(manifests))
    )
    thread = threading.Thread(target=cockpit.serve, daemon=True)
    thread.start()
    try:
        transport.send(f"launch {task}")
        transport.wait_for("▸ bash: sleep 600")
        (session,) = cockpit.sessions()
        assert transport.stops == [session.id]  # the ❌ Stop button, bound to the session
        (run_id,) = run_ids(state_dir)
        assert len(live_leases(cli_env(state_dir))) == 1
        transport.send("please also update the README")  # a reply in the running thread
        # The script engine takes none (an agent image older than steering does not answer)
        transport.wait_for("↳ message 1 did not reach the brain: ", timeout=120)
        transport.send(action="kill", request=session.id, user=MALLORY)
        transport.wait_for("only this cockpit's operators may kill")
        transport.send(action="kill", request=session.id)
        out = transport.wait_for("(exit 130)")
        out = transport.wait_for("none left")
    finally:
        transport.stop()
        thread.join(60)
    assert f"session {session.id}: stopping (asked by test:{ALICE})" in out
    assert f"run {run_id} killed" in out and f"stopped by test:{ALICE}" in out
    assert "leases: 1 revoked, none open; containers, networks and volumes: none left" in out
    (session,) = cockpit.sessions()
    assert (session.state, session.stopped_by) == ("killed", f"test:{ALICE}")
    assert leftovers(docker_client, run_id) == []
    assert live_leases(cli_env(state_dir)) == []
    assert CANARY not in out


@pytest.mark.usefixtures("without_docker")
def test_kill_denies_a_pending_request(cockpit_world: Any, state_dir: Path) -> None:
    transport, start, base, _ = cockpit_world
    task = _task(base, "pending", ["true"], egress=["docs"])
    cockpit = start()
    transport.send(f"launch {task}")
    transport.wait_for("needs approval")
    (request,) = transport.requests
    transport.send(f"kill {request}")
    out = transport.wait_for(f"session {request} denied by test:{ALICE}; nothing ran")
    assert [s.state for s in cockpit.sessions()] == ["denied"]
    assert run_ids(state_dir) == []
    assert "nothing ran" in out


def test_ten_sessions_at_once_all_finish_and_same_root_ones_never_write_together(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    """Ten launches on one cockpit over five project roots (4 + 3 + 1 + 1 + 1): those on
    different roots run at once; those on the same root are queued, visibly, and run one
    after the other (a step that finds another run's marker in the root fails, and the runs'
    own records never overlap); every one succeeds; status shows them all."""
    import yaml

    transport, start, base, _ = cockpit_world
    roots = [make_project(base, f"root{i}") for i in range(5)]
    counts = [4, 3, 1, 1, 1]
    steps = ["mkdir .busy", "sleep 2", "rmdir .busy", "echo done >> runs.txt"]
    tasks = []
    for index, (root, count) in enumerate(zip(roots, counts, strict=True)):
        for n in range(count):
            task = base / "tasks" / f"t{index}-{n}.yml"
            task.parent.mkdir(exist_ok=True)
            document = {
                "apiVersion": "kagura.dev/v1",
                "kind": "Task",
                "metadata": {"name": f"conc-{index}-{n}"},
                "spec": {"project_root": str(root), "steps": steps, "verify": ["true"]},
            }
            task.write_text(yaml.safe_dump(document, sort_keys=False))
            tasks.append(task)
    cockpit = start()
    for task in tasks:
        transport.send(f"launch {task}")
    transport.wait_for("queued behind s-")
    transport.send("status")
    listing = transport.wait_for("    queued behind s-")
    assert "    phase: " in listing
    deadline = time.monotonic() + 480
    while True:
        sessions = list(cockpit.registry.listing(closed=20))
        if len(sessions) == 10 and all(s.state not in ("queued", "running") for s in sessions):
            break
        assert time.monotonic() < deadline, transport.text()
        time.sleep(0.5)
    assert sorted(s.state for s in sessions) == ["succeeded"] * 10, transport.text()
    out = transport.text()
    assert out.count("queued behind s-") >= 3 + 2  # every later same-root launch said so
    for root, count in zip(roots, counts, strict=True):
        assert (root / "runs.txt").read_text() == "done\n" * count
    # The runs' own records: same-root runs never overlap in time.
    with StateStore(state_dir / "state.db") as store:
        rows = {
            r["run_id"]: (r["started_at"], r["ended_at"])
            for r in store.conn.execute("SELECT run_id, started_at, ended_at FROM runs")
        }
    by_root: dict[str, list[tuple[str, str]]] = {}
    for session in sessions:
        assert session.root is not None and session.run_id is not None
        by_root.setdefault(session.root, []).append(rows[session.run_id])
    assert sorted(len(v) for v in by_root.values()) == sorted(counts)
    for windows in by_root.values():
        windows.sort()
        for (_, ended), (started, _) in pairwise(windows):
            assert ended <= started, windows
    for session in sessions:
        assert leftovers(docker_client, session.run_id or "") == []


# --- the documented Transport manifests, each served for real ------------------------------


def _documented_transports() -> list[dict[str, Any]]:
    import re

    import yaml

    text = (REPO / "docs" / "cockpit.md").read_text(encoding="utf-8")
    found = []
    for body in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S):
        document = yaml.safe_load(body)
        if isinstance(document, dict) and document.get("kind") == "Transport":
            found.append(document)
    return found


def test_the_docs_show_a_complete_transport_manifest_for_each_type() -> None:
    import json as _json

    schema = _json.loads((REPO / "schemas" / "transport.json").read_text())
    types = schema["properties"]["spec"]["properties"]["type"]["enum"]
    assert sorted(d["spec"]["type"] for d in _documented_transports()) == sorted(types)


@pytest.mark.parametrize("kind", ["cli", "slack", "discord"])
def test_each_documented_transport_manifest_serves(
    kind: str, tmp_path: Path, state_dir: Path
) -> None:
    """The example of docs/cockpit.md, as written (secret references included, a keyring
    one resolved through a file keyring), is served by `kagura-agent serve --transport
    NAME`; its operator's `status` is answered (only the API root points at the fake)."""
    import contextlib

    import yaml

    from testing.fake_discord import FakeDiscord
    from testing.fake_slack import FakeSlack

    (document,) = [d for d in _documented_transports() if d["spec"]["type"] == kind]
    name, spec = document["metadata"]["name"], document["spec"]
    env = {**os.environ, "NO_COLOR": "1", "XDG_DATA_HOME": str(tmp_path / "xdg")}
    env["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"
    bot, app = "xoxb-doc-example-bot", "xapp-doc-example-app"
    with contextlib.ExitStack() as stack:
        fake: Any = None
        if kind == "slack":
            fake = stack.enter_context(FakeSlack(bot, app))
        elif kind == "discord":
            fake = stack.enter_context(FakeDiscord(bot))
        if fake is not None:
            document = {**document, "spec": {**spec, "base_url": fake.base_url}}
        for key in ("token", "app_token"):  # give each reference its value, as an operator would
            ref = spec.get(key)
            value = bot if key == "token" else app
            if ref and ref.startswith("env:"):
                env[ref[4:]] = value
            elif ref and ref.startswith("keyring:"):
                service, _, user = ref[8:].partition("/")
                store = f"import keyring; keyring.set_password({service!r}, {user!r}, {value!r})"
                subprocess.run([sys.executable, "-c", store], env=env, check=True)
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "transport.yml").write_text(yaml.safe_dump(document, sort_keys=False))
        serve = subprocess.Popen(
            [sys.executable, "-m", "kagura_agent", "serve", "--manifests", str(manifests),
             "--transport", name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip
        try:
            operator = (spec.get("operators") or [""])[0]
            if kind == "cli":
                out, _ = serve.communicate("status\n", timeout=60)
                assert "no sessions yet" in out, out
            elif kind == "slack":
                fake.wait_for_connection(timeout=30)
                fake.send_message(operator, "D0DOCS", "status", ts="1700000000.000100")
                (post,) = fake.wait_for_posts(1, timeout=30)
                assert post.payload["text"] == "no sessions yet"
            else:
                fake.wait_for_connection(timeout=30)
                fake.send_message(operator, "3000000000000000001", "status")
                (post,) = fake.wait_for_posts(1, timeout=30)
                assert post.payload["content"] == "no sessions yet"
        finally:
            if serve.poll() is None:
                serve.terminate()
            out = serve.communicate(timeout=60)[0]
    assert serve.returncode == 0, out
    assert bot not in out and app not in out


# --- graduation proposals in chat --------------------------------------------------------

EAGER_GRADUATION = """\
apiVersion: kagura.dev/v1
kind: Graduation
metadata: {name: default}
spec: {min_successes: 2, min_distinct_tasks: 1, cooldown: 1s}
"""


def _earn(state_dir: Path, category: str, run: str) -> None:
    """Two verified successes two seconds apart, ending a minute ago: a proposal stands."""
    from datetime import UTC, datetime, timedelta

    from kagura_agent.clock import FixedClock
    from kagura_agent.graduation import record_outcome

    clock = FixedClock(datetime.now(UTC) - timedelta(minutes=1))
    with StateStore(state_dir / "state.db") as store:
        for n in (1, 2):
            record_outcome(store, [category], f"{run}-{n}", "t", "sha256:f", [("true", 0)], clock)
            clock.advance(timedelta(seconds=2))


def test_graduation_proposals_are_asked_in_the_operators_channel_and_logged_as_the_cli_logs(
    tmp_path: Path, state_dir: Path
) -> None:
    """Three categories have earned a proposal: each is posted once to the operators'
    channel with its evidence and Approve / Deny. An approval from chat graduates it
    through the same call as `kagura-agent graduation approve`, and the approval log holds
    the same record but for who and via; a denial and a silence are logged too and leave
    the category locked; a stranger's press changes nothing."""
    from kagura_agent.cli import main as cli_main
    from kagura_agent.graduation import snapshot

    manifests = manifest_set(
        tmp_path,
        *({"kind": "EgressPolicy", "metadata": {"name": n}, "spec": {"allow": [{"host": f"{n}.invalid"}]}}
          for n in ("docs", "wheels", "npm", "cli")),
    )  # fmt: skip
    (manifests / "graduation.yml").write_text(EAGER_GRADUATION)  # the packaged knobs, lowered
    for category in ("egress:docs", "egress:wheels", "egress:npm", "egress:cli"):
        _earn(state_dir, category, f"run-{category[7:]}")
    transport = ScriptedTransport()
    cockpit = Cockpit(
        transport,
        CockpitConfig(
            operators=frozenset({ALICE}),
            manifests=str(manifests),
            channel="C-OPS",
            approval_timeout=3.0,
        ),
    )
    assert (
        cli_main.main(["graduation", "approve", "egress:cli", "--manifests", str(manifests)]) == 0
    )
    assert cockpit.propose_graduations(None)  # as serve does once its transport can post
    asked = {
        text.split()[2].rstrip(":"): (thread, text)
        for kind, thread, text in transport.posts
        if kind == "ask"
    }
    by_category = {text.split()[3]: request for request, (_, text) in asked.items()}
    assert sorted(by_category) == ["egress:docs", "egress:npm", "egress:wheels"]
    assert {thread for thread, _ in asked.values()} == {"C-OPS"}
    text = asked[by_category["egress:docs"]][1]
    assert "2 verified successes over 1 distinct tasks in 2s" in text and "no failure" in text
    assert cockpit.propose_graduations(None)  # asked once, not again without new evidence
    assert len([p for p in transport.posts if p[0] == "ask"]) == 3
    thread = threading.Thread(target=cockpit.serve, daemon=True)
    thread.start()
    try:
        transport.inbox.put(
            Event("test", MALLORY, "C-OPS:1", action="approve", request=by_category["egress:docs"])
        )
        transport.wait_for("only this cockpit's operators may approve")
        transport.inbox.put(
            Event("test", ALICE, "C-OPS:1", action="approve", request=by_category["egress:docs"])
        )
        transport.inbox.put(
            Event("test", ALICE, "C-OPS:2", action="deny", request=by_category["egress:wheels"])
        )
        transport.wait_for(f"egress:docs graduated by test:{ALICE}")
        transport.wait_for(f"egress:wheels stays locked: denied by test:{ALICE}")
        out = transport.wait_for("no answer within 3s; it stays locked", timeout=30)
    finally:
        transport.stop()
        thread.join(60)
    assert "egress:npm" in out.splitlines()[-1]
    with StateStore(state_dir / "state.db") as store:
        states = {c: s.state for c, s in snapshot(store, cockpit._knobs()).categories.items()}
        log = {
            d.category: d
            for d in approvals.history(store)
            if d.kind == "graduation"
        }  # fmt: skip
    assert states == {
        "egress:cli": "graduated",
        "egress:docs": "graduated",
        "egress:wheels": "proposed",
        "egress:npm": "proposed",
    }
    chat, cli = log["egress:docs"], log["egress:cli"]
    assert (chat.outcome, chat.who, chat.via) == ("approved", f"test:{ALICE}", "test")
    assert (chat.kind, chat.fingerprint, chat.reason) == (cli.kind, cli.fingerprint, cli.reason)
    assert cli.via == "cli"
    assert (log["egress:wheels"].outcome, log["egress:wheels"].who) == ("denied", f"test:{ALICE}")
    assert (log["egress:npm"].outcome, log["egress:npm"].who) == ("timeout", "nobody")


@pytest.mark.usefixtures("docker_client")
def test_a_run_that_makes_a_category_eligible_gets_its_proposal_approved_from_chat(
    cockpit_world: Any, state_dir: Path
) -> None:
    """egress:docs has one verified success from a minute ago; a chat launch asks for it,
    is approved, runs and verifies: the second success makes the proposal stand, and it is
    posted in that thread (no operators' channel here) with Approve / Deny. Approved from
    chat, the category is graduated: launching the task again asks for nothing."""
    from datetime import UTC, datetime, timedelta

    from kagura_agent.clock import FixedClock
    from kagura_agent.graduation import record_outcome

    transport, start, base, _ = cockpit_world
    (base / "manifests" / "graduation.yml").write_text(EAGER_GRADUATION)
    with StateStore(state_dir / "state.db") as store:
        clock = FixedClock(datetime.now(UTC) - timedelta(minutes=1))
        record_outcome(store, ["egress:docs"], "run-old", "t", "sha256:f", [("true", 0)], clock)
    task = _task(base, "earns", ["true"], egress=["docs"])
    start()
    transport.send(f"launch {task}")
    transport.wait_for("needs approval")
    transport.send(action="approve", request=transport.requests[0])
    out = transport.wait_for("graduation proposal g-", timeout=120)
    assert "(exit 0)" in out
    assert "egress:docs has earned it: 2 verified successes over 2 distinct tasks" in out
    proposal = transport.requests[-1]
    assert proposal.startswith("g-")
    transport.send(action="approve", request=proposal)
    transport.wait_for(f"egress:docs graduated by test:{ALICE} ({proposal})")
    asked = len(transport.requests)
    transport.send(f"launch {task}")
    deadline = time.monotonic() + 120
    while transport.text().count("(exit 0)") < 2:
        assert time.monotonic() < deadline, transport.text()
        time.sleep(0.1)
    assert len(transport.requests) == asked  # graduated: no approval asked any more
    decisions = approvals.history(StateStore(state_dir / "state.db"), category="egress:docs")
    assert [(d.kind, d.outcome, d.who, d.via) for d in decisions if d.kind == "graduation"] == [
        ("graduation", "approved", f"test:{ALICE}", "test")
    ]


def test_a_graduation_proposal_the_chat_did_not_take_is_asked_again(
    tmp_path: Path, state_dir: Path
) -> None:
    """A post that fails (a Gateway not connected yet) does not count as asked: the next
    call asks again, and only then is there a request to answer."""
    manifests = manifest_set(tmp_path)
    (manifests / "graduation.yml").write_text(EAGER_GRADUATION)
    _earn(state_dir, "egress:docs", "run-docs")
    transport = ScriptedTransport()
    answer = transport.ask

    def not_yet(thread: str, text: str, request: str) -> None:
        raise KaguraError("the discord transport is not connected")

    transport.ask = not_yet  # type: ignore[method-assign]
    cockpit = Cockpit(
        transport,
        CockpitConfig(operators=frozenset({ALICE}), manifests=str(manifests), channel="C-OPS"),
    )
    assert not cockpit.propose_graduations(None)
    assert cockpit._graduations == {} and not cockpit._timers
    transport.ask = answer  # type: ignore[method-assign]
    assert cockpit.propose_graduations(None)
    (request,) = transport.requests
    assert cockpit._graduations == {request: ("egress:docs", "C-OPS")}
    cockpit.shutdown()  # a proposal open at a stop is logged as a timeout
    with StateStore(state_dir / "state.db") as store:
        (decision,) = [d for d in approvals.history(store) if d.kind == "graduation"]
    assert (decision.outcome, decision.reason) == (
        "timeout",
        "the cockpit stopped before anyone answered",
    )


def test_a_reply_in_a_running_sessions_thread_reaches_its_brain_mid_run(
    cockpit_world: Any, docker_client: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steering: `run run: sleep 6` (the sdk engine against the fake claude); while its
    Bash sleeps, an operator's reply in the thread goes to apply, over the channel into the
    container, into the SDK's streaming input; the CLI answers it as the next user message
    (the fake echoes it) and the run ends once both are answered. A stranger's reply does
    not reach it."""
    from chat_helpers import API_KEY

    from testing.agent_test_image import ensure_agent_test_image

    transport, _start, base, _ = cockpit_world
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    image = ensure_agent_test_image(docker_client)
    manifests = manifest_set(
        base / "steer",
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
    )
    cockpit = Cockpit(
        transport,
        CockpitConfig(
            operators=frozenset({ALICE}),
            manifests=str(manifests),
            project_root=make_project(base, "steered"),
            image="agent-test",
        ),
    )
    thread = threading.Thread(target=cockpit.serve, daemon=True)
    thread.start()
    try:
        transport.send("run run: sleep 6")
        transport.wait_for("▸ Bash: sleep 6", timeout=180)
        transport.send("and also list the README", user=MALLORY)
        transport.wait_for("only this cockpit's operators may say")
        transport.send("and also list the README")
        out = transport.wait_for("(exit 0)", timeout=120)
    finally:
        transport.stop()
        thread.join(60)
    assert f"message from test:{ALICE} sent to its brain" in out
    assert "↳ message 1 reached the brain as its next user message" in out
    # The brain's words, framed line by line (hygiene.agent_lines).
    assert "💬\n┃ Heard mid-run: and also list the README" in out
    assert out.index("┃ Ran the command.") < out.index("┃ Heard mid-run")
    (session,) = cockpit.sessions()
    assert session.state == "succeeded"
    assert leftovers(docker_client, session.run_id or "") == []


def test_a_session_whose_root_is_inside_a_running_ones_is_queued(
    cockpit_world: Any, docker_client: Any, state_dir: Path
) -> None:
    """apply refuses a root inside a live run's root (the outer agent could write in it);
    the cockpit queues such a launch, as it does one on the same root, and both succeed."""
    import yaml

    transport, start, base, _ = cockpit_world
    outer = make_project(base, "outer")
    inner = make_project(outer, "inner")
    tasks = []
    for name, root in (("outer", outer), ("inner", inner)):
        task = base / "tasks" / f"{name}.yml"
        task.parent.mkdir(exist_ok=True)
        document = {
            "apiVersion": "kagura.dev/v1",
            "kind": "Task",
            "metadata": {"name": f"nested-{name}"},
            "spec": {"project_root": str(root), "steps": ["sleep 2"], "verify": ["true"]},
        }
        task.write_text(yaml.safe_dump(document, sort_keys=False))
        tasks.append(task)
    cockpit = start()
    for task in tasks:
        transport.send(f"launch {task}")
    transport.wait_for("(a project root inside the other's)")
    deadline = time.monotonic() + 240
    while True:
        sessions = list(cockpit.registry.listing(closed=20))
        if len(sessions) == 2 and all(s.state not in ("queued", "running") for s in sessions):
            break
        assert time.monotonic() < deadline, transport.text()
        time.sleep(0.5)
    assert sorted(s.state for s in sessions) == ["succeeded"] * 2, transport.text()
