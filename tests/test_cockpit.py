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
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, leftovers, make_project, manifest_set, run_ids, write_task

from kagura_agent import approvals
from kagura_agent.clock import SystemClock
from kagura_agent.cockpit.core import Cockpit, CockpitConfig
from kagura_agent.cockpit.intents import classify
from kagura_agent.cockpit.registry import Registry, Session
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import KaguraError
from kagura_agent.state import StateStore

ALICE, MALLORY = "U-alice", "U-mallory"
THREAD = "C1:100.1"


class ScriptedTransport:
    """Events in through :meth:`send`; everything the cockpit posts kept in order."""

    name = "test"

    def __init__(self) -> None:
        self.inbox: queue.Queue[Event | None] = queue.Queue()
        self.posts: list[tuple[str, str, str]] = []  # (kind, thread, text); kind say|ask
        self.requests: list[str] = []
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


def test_registry_races_and_expiry(state_dir: Path) -> None:
    registry = Registry(state_dir / "state.db", SystemClock())
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


def test_a_restart_settles_runs_whose_apply_is_gone(cockpit_world: Any, state_dir: Path) -> None:
    """An apply that ended while no cockpit ran gets the outcome it recorded; one that was
    killed before it could record any is lost; a pending request lapses."""
    from kagura_agent.apply.runs import MIGRATIONS

    transport, start, _, _ = cockpit_world
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    registry = Registry(state_dir / "state.db", SystemClock())
    registry.add(Session(id="s-done", state="running", pid=pid, pid_start="t0", **_ROW))
    registry.add(Session(id="s-gone", state="running", pid=pid, pid_start="t1", **_ROW))
    registry.add(Session(id="s-ask", state="awaiting-approval", **_ROW))
    store = StateStore(state_dir / "state.db")
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


@pytest.mark.docker
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


@pytest.mark.docker
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
    decisions = approvals.history(StateStore(), category="egress:docs")
    assert [(d.outcome, d.who, d.via, d.fingerprint) for d in decisions] == [
        ("approved", f"test:{ALICE}", "test", session.fingerprint)
    ]
    transport.send(action="approve", request=request)
    assert "is succeeded; nothing to answer" in transport.wait_for("nothing to answer")
    assert leftovers(docker_client, session.run_id or "") == []


@pytest.mark.docker
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
    outcomes = sorted(d.outcome for d in approvals.history(StateStore(), category="egress:docs"))
    assert outcomes == ["denied", "timeout"]
    assert run_ids(state_dir) == []


@pytest.mark.docker
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


@pytest.mark.docker
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


@pytest.mark.docker
def test_serve_on_the_terminal(tmp_path: Path, state_dir: Path, docker_client: Any) -> None:
    """`kagura-agent serve` as an operator runs it: commands on stdin, answers on stdout."""
    task = _task(tmp_path, "tty", ["true"], egress=["docs"])
    manifests = manifest_set(
        tmp_path / "m",
        {
            "kind": "EgressPolicy",
            "metadata": {"name": "docs"},
            "spec": {"allow": [{"host": "docs.invalid"}]},
        },
    )
    env = {**os.environ, "NO_COLOR": "1"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "serve", "--manifests", str(manifests)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert serve.stdin is not None and serve.stdout is not None
    lines: list[str] = []

    def until(needle: str) -> None:
        deadline = time.monotonic() + 90
        while not any(needle in line for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            line = serve.stdout.readline()  # type: ignore[union-attr]
            assert line, "".join(lines)
            lines.append(line)

    try:
        serve.stdin.write(f"launch {task}\n")
        serve.stdin.flush()
        until("answer: approve ")
        request = next(x for x in lines if "answer: approve" in x).split()[2]
        serve.stdin.write(f"approve {request}\n")
        serve.stdin.flush()
        until("(exit 0)")
        serve.stdin.close()  # EOF: the operator is done
        assert serve.wait(30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
    out = "".join(lines)
    assert "approved by terminal:" in out
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


@pytest.mark.docker
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


@pytest.mark.docker
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


@pytest.mark.docker
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
