"""One scripted cockpit session per transport, driven for real: `kagura-agent serve` on the
terminal (its stdin and stdout), on the fake Slack (Web API + Socket Mode) and on the fake
Discord (REST + Gateway); real containers; the fake claude driving the sdk engine.

The same script on each, in one serve:

1. the standing graduation proposal (egress:docs) is posted to the operators' channel and
   approved there;
2. a launched session's thread gets a reply while its first command runs: it reaches the
   brain as its next user message (the fake claude echoes it);
3. the brain asks mid-run for a second egress host (approved: the agent then reaches it
   through its reloaded proxy), a third (denied), one no manifest allows (refused with the
   reason, nobody asked) and a credential (approved: the lease is pushed in);
4. the reply asked for a long answer: the final answer arrives whole, as a file (Slack),
   an attachment (Discord) or printed between rulers (terminal);
5. a session whose brain runs out of turns, then of dollars: both extended in its thread;
6. `run TEXT` typed in chat: a one-off task with the LLM brain; `say SESSION TEXT` typed
   as a new message reaches that session's brain;
7. a session holding a lease needs approval at launch: a stranger's press is refused, the
   operator's starts it; it runs short of its wall budget: the extension is approved in
   its thread; then it is stopped (❌ Stop / `kill`) and the thread says what was revoked
   and removed.

Every post is in the operators' channel or in the thread of the message that asked for
it (Slack and Discord).

Everything is asserted from the outside: what the chat fake received, what the upstream
server saw (from whom), the run records and amendments, the approval log, the lease
ledger and Docker.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from apply_helpers import (
    REPO,
    TEST_LABEL,
    cli_env,
    leftovers,
    live_leases,
    make_project,
    run_ids,
    write_task,
)
from chat_helpers import (
    API_KEY,
    CANARY,
    LEASED_SPEC,
    LONG_LINES,
    long_answer_lines,
    session_world,
)
from test_midrun_apply import WAIT_UPSTREAM, access, fetch, policy

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.approvals import history
from kagura_agent.membrane import images
from kagura_agent.membrane.egress.owner import COMPONENT_OUTBOUND, LABEL_COMPONENT
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.state import open_store
from kagura_agent.units import format_duration

pytestmark = pytest.mark.usefixtures("docker_client")

SLACK_BOT, SLACK_APP = "xoxb-script-canary-bot-41c2", "xapp-script-canary-app-9d0e"
DISCORD_TOKEN = "MTEwMC5zY3JpcHQ.discord-script-canary.0b7d"
SLACK_ALICE, SLACK_DM, SLACK_OPS = "U0ALICE", "D0ALICE", "C0OPS"
DISCORD_ALICE, DISCORD_DM = "2000000000000000001", "3000000000000000001"
DISCORD_OPS = "3000000000000000009"
MIDTOKEN = "kagura-script-midrun-token-" + "s" * 20
STEER = "please also say: 400 lines of it"
SAID = "and also list the README"  # `say SESSION TEXT`, to the `run` session
WALL = 45  # seconds; asked a third ahead (15 s), doubled to 90

# The upstream both hosts resolve to: it says which Host was asked, and logs who asked.
UPSTREAM = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("GET", self.headers.get("Host", "?"), self.client_address[0], flush=True)
        body = ("hello from " + self.headers.get("Host", "?")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
print("ready", flush=True)
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""
FILE_TOKEN = {
    "kind": "CredentialProvider",
    "metadata": {"name": "filetoken"},
    "spec": {
        "type": "static",
        "standing": True,
        "secret": "env:KAGURA_SCRIPT_TOKEN",
        "static": {"file": "filetoken"},
        "scopes": {"use": {"description": "a canary token, as a file"}},
    },
}


@pytest.fixture()
def upstream(docker_client: Any) -> Iterator[Any]:
    network = docker_client.networks.create(
        f"kagura-script-{uuid.uuid4().hex[:8]}", driver="bridge", internal=True, labels=TEST_LABEL
    )
    container = docker_client.containers.run(
        images.image_ref("base"),
        ["python3", "-c", UPSTREAM],
        detach=True,
        labels=TEST_LABEL,
        network=network.name,
        user="1000:1000",
    )
    try:
        deadline = time.monotonic() + 15
        while b"ready" not in container.logs():
            assert time.monotonic() < deadline, "upstream never started"
            time.sleep(0.05)
        yield container
    finally:
        container.remove(force=True)
        network.remove()


# --- the chats, as a person uses each ------------------------------------------------------


@dataclass(frozen=True)
class Said:
    """One thing the cockpit posted: its text, where, and what it carries."""

    text: str
    thread: str  # the launch it answers ("" for the operators' channel / the terminal)
    channel: str = ""  # where it was posted (the terminal: "")
    key: Any = None  # what a press needs (a post), or None
    requests: tuple[str, ...] = ()  # request ids its buttons (or commands) answer
    file: tuple[str, str] | None = None  # (name, content) of a file / attachment


class Chat:
    """serve on one transport: start it, say things, press buttons, read what it posted."""

    kind = ""
    who = ""  # TRANSPORT:USER of the operator
    ops = ""  # the operators' channel
    stranger: str | None = None  # a user who is no operator (the terminal has none)

    def transport(self) -> dict[str, Any] | None:
        return None

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        self.serve = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.serve.stdout:  # type: ignore[union-attr]
            self.output.append(line)

    def stop(self) -> str:
        """End serve as its operator would (Ctrl-D / SIGTERM); its own output."""
        if self.serve.poll() is None:
            self.serve.terminate()
        assert self.serve.wait(90) == 0, "".join(self.output)
        self._reader.join(10)
        return "".join(self.output)

    def posts(self) -> list[Said]:
        raise NotImplementedError

    def send(self, text: str) -> str:
        """A new message to the cockpit; the thread its answers go to."""
        raise NotImplementedError

    def reply(self, thread: str, text: str) -> None:
        raise NotImplementedError

    def press(self, said: Said, answer: str, by: str | None = None) -> None:
        """Press ``answer`` on ``said`` as the operator (or as ``by``)."""
        raise NotImplementedError

    def in_thread(self, said: Said, thread: str | None) -> bool:
        return thread is None or said.thread == thread

    def wait(self, needle: str, thread: str | None = None, timeout: float = 240) -> Said:
        """The first post (in ``thread``, if given) containing ``needle``."""
        deadline = time.monotonic() + timeout
        while True:
            for said in self.posts():
                if needle in said.text and self.in_thread(said, thread):
                    return said
            if time.monotonic() > deadline or self.serve.poll() is not None:
                pytest.fail(f"no {needle!r} in:\n" + self.transcript())
            time.sleep(0.1)

    def transcript(self, thread: str | None = None) -> str:
        return "\n".join(
            said.text + (f"\n[file {said.file[0]}]\n{said.file[1]}" if said.file else "")
            for said in self.posts()
            if self.in_thread(said, thread)
        )


class Terminal(Chat):
    """The terminal: one stream. A "thread" is the line a launch was typed at (what was
    printed after it); a question is its lines up to its answer line."""

    kind = "terminal"
    _HEADERS = re.compile(
        r"^(session \S+ (asks \(m-|needs approval for plan)|graduation proposal g-"
        r"|session \S+ is running: ❌)"
    )

    def __init__(self) -> None:
        from kagura_agent.approvals import operator_name

        self.who = f"terminal:{operator_name()}"

    def stop(self) -> str:
        self.serve.stdin.close()  # type: ignore[union-attr]  # Ctrl-D
        assert self.serve.wait(90) == 0, "".join(self.output)
        return super().stop()

    def posts(self) -> list[Said]:
        """Each line the terminal printed, except that a question (or a running session's
        stop offer) is one post with the request its answer line names, and a file is one
        post between its rulers. ``key`` is the line it starts at."""
        lines = [x.rstrip("\n") for x in list(self.output)]
        found: list[Said] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            ruler = re.match(r"^──── (\S+) \(\d+ chars\) ────$", line)
            if ruler:
                name = ruler.group(1)
                end = next(
                    (j for j in range(i, len(lines)) if lines[j] == f"──── end of {name} ────"),
                    None,
                )
                if end is None:
                    break  # still printing
                comment = found.pop().text if found else ""
                found.append(
                    Said(comment, str(i), key=i, file=(name, "\n".join(lines[i + 1 : end]) + "\n"))
                )
                i = end + 1
                continue
            if self._HEADERS.match(line):
                end = next(
                    (
                        j
                        for j in range(i, len(lines))
                        if lines[j].startswith("  ")
                        and re.match(r"^  (answer: approve|stop it: kill) ", lines[j])
                    ),
                    None,
                )
                if end is None:
                    break  # still printing
                request = (
                    lines[end].split()[2] if "answer:" in lines[end] else lines[end].split()[-1]
                )
                found.append(
                    Said("\n".join(lines[i : end + 1]), str(i), key=i, requests=(request,))
                )
                i = end + 1
                continue
            found.append(Said(line, str(i), key=i))
            i += 1
        return found

    def type_in(self, text: str) -> None:
        self.serve.stdin.write(text + "\n")  # type: ignore[union-attr]
        self.serve.stdin.flush()  # type: ignore[union-attr]

    def send(self, text: str) -> str:
        mark = str(len(self.output))
        self.type_in(text)
        return mark

    def reply(self, thread: str, text: str) -> None:
        self.type_in(text)  # a line that is no command: for the running session

    def press(self, said: Said, answer: str, by: str | None = None) -> None:
        assert by is None, "the terminal has one user"
        (request,) = said.requests
        self.type_in(f"{answer} {request}")

    def in_thread(self, said: Said, thread: str | None) -> bool:
        return int(said.key) >= int(thread or 0)  # printed since the launch


def _slack_shown(text: str) -> str:
    """What Slack shows of a posted text: its three escapes read back (the cockpit posts
    text as text, never markup)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


class Slack(Chat):
    kind = "slack"
    who = f"slack:{SLACK_ALICE}"
    ops = SLACK_OPS
    stranger = "U0MALLORY"
    _ACTIONS = {"approve": "kagura_approve", "deny": "kagura_deny", "kill": "kagura_kill"}

    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self._ts = 1700000000

    def transport(self) -> dict[str, Any]:
        return {
            "kind": "Transport",
            "metadata": {"name": "chat"},
            "spec": {
                "type": "slack",
                "token": "env:KAGURA_TEST_SLACK_BOT",
                "app_token": "env:KAGURA_TEST_SLACK_APP",
                "operators": [SLACK_ALICE],
                "channel": SLACK_OPS,
                "base_url": self.fake.base_url,
            },
        }

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        env = {**env, "KAGURA_TEST_SLACK_BOT": SLACK_BOT, "KAGURA_TEST_SLACK_APP": SLACK_APP}
        super().start(argv, env)
        self.fake.wait_for_connection(timeout=60)

    def posts(self) -> list[Said]:
        found = []
        for post in list(self.fake.posts):
            blocks = post.payload.get("blocks") or []
            values = tuple(
                e["value"] for b in blocks for e in b.get("elements", []) if e.get("value")
            )
            thread = post.payload.get("thread_ts") or ""
            channel = str(post.payload.get("channel", ""))
            text = _slack_shown(str(post.payload.get("text", "")))
            found.append(Said(text, thread, channel, post, values[:1]))
        for upload in list(self.fake.uploads):
            file = (upload.filename, upload.content.decode())
            thread = upload.thread_ts or ""
            comment = _slack_shown(upload.initial_comment)
            found.append(Said(comment, thread, upload.channel, file=file))
        return found

    def send(self, text: str) -> str:
        self._ts += 100
        ts = f"{self._ts}.000100"
        self.fake.send_message(SLACK_ALICE, SLACK_DM, text, ts=ts)
        return ts

    def reply(self, thread: str, text: str) -> None:
        self.fake.send_message(SLACK_ALICE, SLACK_DM, text, thread_ts=thread)

    def press(self, said: Said, answer: str, by: str | None = None) -> None:
        (request,) = said.requests
        post = said.key
        channel = post.payload.get("channel") or SLACK_DM
        self.fake.press(by or SLACK_ALICE, channel, post.ts, self._ACTIONS[answer], request)


class Discord(Chat):
    kind = "discord"
    who = f"discord:{DISCORD_ALICE}"
    ops = DISCORD_OPS
    stranger = "2200000000000000666"
    _BUTTONS = {"approve": "kagura_approve", "deny": "kagura_deny", "kill": "kagura_kill"}

    def __init__(self, fake: Any) -> None:
        self.fake = fake

    def transport(self) -> dict[str, Any]:
        return {
            "kind": "Transport",
            "metadata": {"name": "dc"},
            "spec": {
                "type": "discord",
                "token": "env:KAGURA_TEST_DISCORD",
                "operators": [DISCORD_ALICE],
                "channel": DISCORD_OPS,
                "base_url": self.fake.base_url,
            },
        }

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        super().start(argv, {**env, "KAGURA_TEST_DISCORD": DISCORD_TOKEN})
        self.fake.wait_for_connection(timeout=60)

    def posts(self) -> list[Said]:
        found = []
        for post in list(self.fake.posts):
            ids = tuple(
                c["custom_id"]
                for row in post.payload.get("components") or []
                for c in row.get("components", [])
            )
            requests = tuple(dict.fromkeys(i.partition(":")[2] for i in ids))
            reference = post.payload.get("message_reference") or {}
            thread = str(reference.get("message_id") or "")
            file = (post.files[0][0], post.files[0][1].decode()) if post.files else None
            text = str(post.payload.get("content", ""))
            found.append(Said(text, thread, post.channel, post, requests, file))
        return found

    def send(self, text: str) -> str:
        return str(self.fake.send_message(DISCORD_ALICE, DISCORD_DM, text))

    def reply(self, thread: str, text: str) -> None:
        # Discord's Reply, to the bot's latest answer in that thread
        answer = [s.key for s in self.posts() if s.thread == thread][-1]
        self.fake.send_message(DISCORD_ALICE, DISCORD_DM, text, reply_to=answer.id)

    def press(self, said: Said, answer: str, by: str | None = None) -> None:
        (request,) = said.requests
        custom_id = f"{self._BUTTONS[answer]}:{request}"
        self.fake.press(by or DISCORD_ALICE, said.key.id, custom_id)


@pytest.fixture(params=["terminal", "slack", "discord"])
def chat(request: pytest.FixtureRequest) -> Iterator[Chat]:
    from testing.fake_discord import FakeDiscord
    from testing.fake_slack import FakeSlack

    if request.param == "terminal":
        yield Terminal()
    elif request.param == "slack":
        with FakeSlack(SLACK_BOT, SLACK_APP) as fake:
            yield Slack(fake)
    else:
        with FakeDiscord(DISCORD_TOKEN) as fake:
            yield Discord(fake)


# --- the script -----------------------------------------------------------------------------


def _task(folder: Path, name: str, spec: dict[str, Any]) -> Path:
    base = {"image": "agent-test", "brain": "claude", "egress": ["anthropic"]}
    return write_task(make_project(folder, name), name, {**base, **spec})


def _question(chat: Chat, needle: str, thread: str, timeout: float = 240) -> Said:
    deadline = time.monotonic() + timeout
    while True:
        said = chat.wait(needle, thread, timeout=max(deadline - time.monotonic(), 1))
        if said.requests:
            return said
        time.sleep(0.1)  # the terminal: the answer line is still to come


def test_a_scripted_session_per_transport(
    chat: Chat, tmp_path: Path, state_dir: Path, docker_client: Any, upstream: Any
) -> None:
    argv, env, _ = session_world(tmp_path, docker_client, chat.transport())
    manifests = Path(argv[argv.index("--manifests") + 1])
    project = Path(argv[argv.index("--project-root") + 1])  # where `run TEXT` works
    extra = [
        policy("second", "second.test"),
        policy("third", "third.test"),
        policy("fourth", "fourth.test"),  # asked for at launch: approved in the thread
        FILE_TOKEN,
    ]
    (manifests / "zz-script.yml").write_text(
        yaml.safe_dump_all([{"apiVersion": "kagura.dev/v1", **d} for d in extra])
    )
    env = {**env, "KAGURA_SCRIPT_TOKEN": MIDTOKEN}
    grants = _task(
        tmp_path,
        "grants",
        {
            "prompt": "\n".join(
                [
                    f"run: {WAIT_UPSTREAM}; {fetch('second.test')}",
                    access("egress", "second", "the data lives on second.test"),
                    access("egress", "third", "and a bit on third.test"),
                    access("egress", "elsewhere.test", "no manifest allows this one"),
                    access("credential", "filetoken/use", "the API needs its token"),
                    f"after: {fetch('second.test')}",
                    f"after: {fetch('third.test')}",
                    "after: test -s /run/kagura/creds/filetoken && echo token-pushed",
                ]
            )
        },
    )
    # 3 Bash turns and an answer at $0.01 each: out of turns after 2, of dollars after 3.
    turns = _task(
        tmp_path,
        "turns",
        {"prompt": "turns: 3\nturn cost: 0.01", "budget": {"turns": 2, "cost_usd": 0.025}},
    )
    extended = write_task(
        make_project(tmp_path, "extended"),
        "extended",
        {
            "steps": ['test -n "$TEST_TOKEN"', "sleep 600"],
            **LEASED_SPEC,
            "egress": [*LEASED_SPEC["egress"], "fourth"],
            "budget": {"wall_time": f"{WALL}s"},
        },
    )
    proxies: set[str] = set()
    chat.start(argv, env)
    try:
        # 1. The standing graduation proposal, in the operators' channel, approved there.
        proposal = _question(chat, "egress:docs has earned it: 2 verified successes", "", 120)
        assert proposal.channel == chat.ops, proposal
        chat.press(proposal, "approve")
        chat.wait(f"egress:docs graduated by {chat.who}")
        # 2. Launch; a reply in the thread while the first command waits reaches the brain.
        thread = chat.send(f"launch {grants}")
        chat.wait("▸ Bash: for i in $(seq 600)", thread)
        chat.reply(thread, STEER)
        chat.wait(f"message from {chat.who} sent to its brain", thread)
        chat.wait("↳ message 1 reached the brain as its next user message", thread)
        proxies |= _connect(docker_client, upstream, state_dir, grants.parent)
        # 3. Mid-run requests: approve, deny, (refused unasked), approve the credential.
        for needle, answer, word in (
            ("asks for egress:second mid-run", "approve", "approved"),
            ("asks for egress:third mid-run", "deny", "denied"),
            ("asks for credential:filetoken/use mid-run", "approve", "approved"),
        ):
            question = _question(chat, needle, thread)
            chat.press(question, answer)
            (request,) = question.requests
            category = needle.split()[2]
            chat.wait(f"{request} {category} {word} by {chat.who}", thread)
        # 4. The long final answer.
        done = chat.wait("(exit 0)", thread)
        # 5. A session whose brain runs out of turns, then of dollars: both extended, and
        # the same brain session finishes.
        third = chat.send(f"launch {turns}")
        more = _question(chat, "~ budget turns 2 → 4", third)
        chat.press(more, "approve")
        chat.wait(f"turn budget extended to 4 turns (approved by {chat.who}", third)
        dollars = _question(chat, "~ budget cost_usd", third)
        chat.press(dollars, "approve")
        chat.wait(f"budget extended to $0.05 (approved by {chat.who}", third)
        chat.wait("(exit 0)", third)
        # 6. `run TEXT` typed in chat; while its command waits, `say SESSION TEXT` typed as
        # a new message reaches its brain.
        ran = chat.send("run run: until test -e .go; do sleep 0.1; done")
        (session,) = _question(chat, "❌ Stop (or `kill s-", ran, 120).requests
        chat.wait("▸ Bash: until test -e .go", ran)
        chat.send(f"say {session} {SAID}")
        chat.wait(f"session {session}: message from {chat.who} sent to its brain", ran)
        chat.wait("↳ message 1 reached the brain as its next user message", ran)
        (project / ".go").write_text("")
        chat.wait("(exit 0)", ran)
        # 7. A leased session that needs approval at launch: a stranger's press is refused,
        # the operator's starts it; short of its wall budget: extended, then stopped.
        second = chat.send(f"launch {extended}")
        launch = _question(chat, "needs approval for plan", second, 120)
        if chat.stranger is not None:
            chat.press(launch, "approve", by=chat.stranger)
            chat.wait("only this cockpit's operators may approve; ignored", second)
        chat.press(launch, "approve")
        chat.wait(f"approved by {chat.who}; applying", second)
        stop = _question(chat, "❌ Stop (or `kill s-", second, 120)
        chat.wait("▸ bash: sleep 600", second)
        wall = _question(chat, f"~ budget wall_seconds {WALL} → {2 * WALL}", second, 180)
        chat.press(wall, "approve")
        chat.wait(f"wall budget extended to {_duration(2 * WALL)}", second)
        chat.press(stop, "kill")
        stopped = chat.wait("none left", second, 120)
        output = chat.stop()
    finally:
        if chat.serve.poll() is None:
            chat.serve.kill()
    said = chat.transcript()
    transcript = chat.transcript(thread)
    # The steering reply reached the brain: the fake claude echoed it.
    assert f"Heard mid-run: {STEER}" in transcript, transcript
    # The long final answer, whole (in one file, in the session's thread).
    [(name, content, comment)] = [
        (*s.file, s.text)
        for s in chat.posts()
        if s.file and f"Heard mid-run: {STEER}" in s.file[1] and chat.in_thread(s, thread)
    ]
    assert comment.startswith("💬 ("), comment
    assert f"chars, {LONG_LINES + 2} lines, whole in {name}) ┃ Heard mid-run: {STEER}" in comment
    assert name.endswith("-text-2.md"), name
    assert content == "\n".join([f"Heard mid-run: {STEER}", *long_answer_lines(),
                                 "END OF THE LONG ANSWER"]) + "\n"  # fmt: skip
    assert "✓ final answer: the text above" in transcript, transcript
    # Mid-run: the brain's tool answers, and what the agent then reached.
    assert f"Access said: granted: egress:second approved by {chat.who}" in transcript
    assert f"Access said: [error] refused: denied by {chat.who}" in transcript
    assert (
        "Access said: [error] refused: nobody was asked, the operator's manifests do not"
        " allow it: no EgressPolicy" in transcript
    ), transcript
    assert f"Access said: granted: credential:filetoken/use approved by {chat.who}" in transcript
    assert "After said (0): hello from second.test:8080" in transcript, transcript
    assert "hello from third.test" not in said
    # The proxy's denials reached the thread: second.test before its grant, third.test.
    assert "⊘ egress denied second.test:8080" in transcript, transcript
    assert "⊘ egress denied third.test:8080" in transcript, transcript
    assert "After said (0): token-pushed" in transcript, transcript
    assert "(exit 0)" in done.text
    # What the upstream saw: second.test only, and only from the run's proxy (after the
    # reload; the first fetch, before the grant, never reached it).
    seen = upstream.logs().decode().split("\n")
    asked = [line.split() for line in seen if line.startswith("GET ")]
    assert [host for _, host, _ in asked] == ["second.test:8080"], seen
    assert {source for _, _, source in asked} <= proxies, (asked, proxies)
    # The turn extension: the same brain session finished its task.
    assert "Finished all 3 turns (resumed " in chat.transcript(third), chat.transcript(third)
    # `run TEXT`: a one-off task with the LLM brain in the project root; `say` reached it.
    ran_text = chat.transcript(ran)
    assert f"session {session}: run-run-until-test--e-go-do-sleep" in ran_text, ran_text
    assert f"writes       {project} -> /workspace" in ran_text, ran_text
    assert "brain        claude (sdk" in ran_text, ran_text
    assert "💬\n┃ Ran the command." in ran_text, ran_text
    assert f"💬\n┃ Heard mid-run: {SAID}" in ran_text, ran_text
    # The launch approval, the wall extension and the stop.
    stop_text = chat.transcript(second)
    (stopped_session,) = stop.requests
    assert f"session {stopped_session} approved by {chat.who}; applying" in stop_text
    assert f"budget:wall_seconds approved by {chat.who}" in stop_text, stop_text
    assert f"session {stopped_session}: stopping (asked by {chat.who})" in stop_text, stop_text
    assert "leases: 1 revoked, none open; containers, networks and volumes: none left" in (
        stopped.text
    )
    assert re.search(r"run \S+ killed in [\d.]+s.*\(exit 130\)", stop_text), stop_text
    if chat.ops:  # a chat: every post in the operators' channel or in its asker's thread
        threads = {thread, third, ran, second}
        posts = chat.posts()
        assert [s for s in posts if s.channel != chat.ops and s.thread not in threads] == []
    # The records: runs, their amendments, the approval log, the ledger, Docker.
    ids = run_ids(state_dir)
    assert len(ids) == 4, ids
    with open_store() as store:
        rows = [amendments(store, run_id) for run_id in ids]
        log = history(store)
        runs = {
            r["run_id"]: (r["outcome"], r["exit_code"])
            for r in store.conn.execute("SELECT run_id, outcome, exit_code FROM runs")
        }
    assert runs == {
        ids[0]: ("success", 0),
        ids[1]: ("success", 0),
        ids[2]: ("success", 0),
        ids[3]: ("interrupted", 130),
    }, runs
    assert [(r["category"], r["outcome"]) for r in rows[0]] == [
        ("egress:second", "granted"),
        ("egress:third", "denied"),
        ("", "refused"),
        ("credential:filetoken/use", "granted"),
    ], rows[0]
    assert [(r["category"], r["outcome"]) for r in rows[1]] == [
        ("budget:turns", "granted"),
        ("budget:cost_usd", "granted"),
    ], rows[1]
    assert rows[2] == [], rows[2]
    assert [(r["category"], r["outcome"]) for r in rows[3]] == [
        ("budget:wall_seconds", "granted")
    ], rows[3]
    # Every decision is the operator's, via this chat (the stranger's press decided nothing).
    assert {(d.who, d.via) for d in log} == {(chat.who, chat.kind)}, log
    graduation = [(d.category, d.outcome) for d in log if d.kind == "graduation"]
    assert graduation == [("egress:docs", "approved")]
    decided = {(d.category, d.fingerprint): d.outcome for d in log if d.kind == "capability"}
    for row in [*rows[0], *rows[1], *rows[3]]:
        if row["outcome"] in ("granted", "denied"):
            want = "approved" if row["outcome"] == "granted" else "denied"
            assert decided[(row["category"], row["fingerprint"])] == want, row
    launched = [(d.category, d.outcome, d.reason) for d in log if d.category == "egress:fourth"]
    assert launched == [("egress:fourth", "approved", "answered in chat")], launched
    assert len(decided) == 7, decided
    for run_id in ids:
        assert leftovers(docker_client, run_id) == []
    assert live_leases(cli_env(state_dir)) == []
    for canary in (CANARY, API_KEY, MIDTOKEN, SLACK_BOT, SLACK_APP, DISCORD_TOKEN):
        assert canary not in said and canary not in output


def _connect(client: Any, upstream: Any, state_dir: Path, project: Path) -> set[str]:
    """Put the upstream on the first run's outbound network as second.test and third.test,
    then let the agent's first command go on; the proxy's addresses there."""
    deadline = time.monotonic() + 120
    while not (ids := run_ids(state_dir)):
        assert time.monotonic() < deadline, "no run started"
        time.sleep(0.1)
    labels = [f"{LABEL_RUN}={ids[0]}", f"{LABEL_COMPONENT}={COMPONENT_OUTBOUND}"]
    while not (nets := client.networks.list(filters={"label": labels})):
        assert time.monotonic() < deadline, "the run never created its outbound network"
        time.sleep(0.05)
    network = nets[0]
    network.reload()
    proxies = {
        c["IPv4Address"].partition("/")[0] for c in (network.attrs.get("Containers") or {}).values()
    }
    network.connect(upstream, aliases=["second.test", "third.test"])
    (project / ".upstream-ready").write_text("go\n")
    return proxies


def _duration(seconds: int) -> str:
    return format_duration(seconds)


def test_the_script_reads_what_each_chat_shows() -> None:
    """The terminal's printed blocks are read as a chat's posts: a question with its
    answer line, a file between its rulers."""
    term = Terminal()
    term.output = [
        "session s-1 asks (m-1-1):\n",
        "The brain asks for egress:second mid-run: why\n",
        "  answer: approve m-1-1  |  deny m-1-1\n",
        "💬 comment\n",
        "──── s-1-text-2.md (4 chars) ────\n",
        "abc\n",
        "──── end of s-1-text-2.md ────\n",
        "session s-1 is running: ❌ Stop\n",
        "  stop it: kill s-1\n",
    ]
    posts = term.posts()
    assert [p.requests for p in posts] == [("m-1-1",), (), ("s-1",)]
    assert posts[1].file == ("s-1-text-2.md", "abc\n") and posts[1].text == "💬 comment"
    assert json.dumps([p.text for p in posts])
