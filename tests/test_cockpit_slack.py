"""The Slack transport through the real slack-bolt, against the fake Slack in testing/.

Every test runs with a guard that refuses any connection beyond 127.0.0.1, so a default
slack.com URL left anywhere would fail here rather than reach the internet.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from chat_helpers import RunningTransport, loopback_guard

from kagura_agent import approvals
from kagura_agent.cockpit.slack import SlackTransport
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import SetupError
from kagura_agent.state import StateStore
from testing.fake_slack import FakeSlack

BOT_TOKEN = "xoxb-canary-bot-5e1d0c"
APP_TOKEN = "xapp-canary-app-93b7af"
ALICE = "U0ALICE"
DM = "D0ALICE"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from loopback_guard(monkeypatch)


@pytest.fixture()
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(bot_token=BOT_TOKEN, app_token=APP_TOKEN) as fake:
        yield fake


class Running(RunningTransport):
    """The transport against this test's fake, running as the cockpit runs it."""

    def __init__(self, slack: FakeSlack, handle: Any = None) -> None:
        super().__init__(
            SlackTransport(BOT_TOKEN, APP_TOKEN, base_url=slack.base_url),
            slack.wait_for_connection,
            handle,
        )


@pytest.fixture()
def running(slack: FakeSlack) -> Iterator[Running]:
    transport = Running(slack)
    yield transport
    if transport.thread.is_alive():
        transport.stop()


def test_a_direct_message_reaches_the_handler_without_the_mention(
    slack: FakeSlack, running: Running
) -> None:
    ack = slack.send_message(ALICE, DM, f"<@{slack.bot_user_id}> deploy the docs")
    sent = slack.received[-1]  # the ack frame, as the fake received it
    assert ack == sent and set(ack) == {"envelope_id"}

    event = running.next_event()
    ts = event.thread.split(":")[1]
    assert event == Event(
        transport="slack", user=ALICE, thread=f"{DM}:{ts}", text="deploy the docs"
    )


def test_a_thread_reply_keeps_the_parent_thread(slack: FakeSlack, running: Running) -> None:
    slack.send_message(ALICE, DM, "and the changelog", thread_ts="1700000000.000100")
    slack.send_message(
        ALICE, "C0GENERAL", "also here", thread_ts="1700000000.000200", subtype="thread_broadcast"
    )

    event, broadcast = running.next_event(), running.next_event()
    assert (event.thread, event.text) == (f"{DM}:1700000000.000100", "and the changelog")
    assert (broadcast.thread, broadcast.text) == ("C0GENERAL:1700000000.000200", "also here")


def test_bot_messages_edits_and_its_own_posts_are_ignored(
    slack: FakeSlack, running: Running
) -> None:
    slack.send_message(slack.bot_user_id, DM, "I said this", bot_id=slack.bot_id)
    slack.send_message("U0OTHERBOT", DM, "beep", bot_id="B0OTHER", subtype="bot_message")
    slack.send_message(ALICE, DM, "edited", subtype="message_changed")
    slack.send_message(ALICE, DM, "a person")

    # envelopes reach the handler in order, so anything not ignored would come first
    assert running.next_event().text == "a person"
    assert running.events.empty()


def test_a_mention_and_its_message_twin_make_one_event(slack: FakeSlack, running: Running) -> None:
    text = f"<@{slack.bot_user_id}> status?"
    slack.send_message(ALICE, "C0GENERAL", text, ts="1700000001.000200")
    slack.send_mention(ALICE, "C0GENERAL", text, ts="1700000001.000200")
    slack.send_mention(ALICE, "C0GENERAL", "<@U0KAGURABOT> and now?", ts="1700000002.000300")

    first, second = running.next_event(), running.next_event()
    assert (first.thread, first.text) == ("C0GENERAL:1700000001.000200", "status?")
    assert (second.thread, second.text) == ("C0GENERAL:1700000002.000300", "and now?")
    assert running.events.empty()


def test_say_posts_text_in_the_thread(slack: FakeSlack, running: Running) -> None:
    running.transport.say(f"{DM}:1700000000.000100", "done: 3 files changed")

    (post,) = slack.wait_for_posts(1)
    assert post.method == "chat.postMessage"
    assert post.payload == {
        "channel": DM,
        "thread_ts": "1700000000.000100",
        "text": "done: 3 files changed",
    }


def test_ask_posts_approve_and_deny_buttons_carrying_the_request(
    slack: FakeSlack, running: Running
) -> None:
    running.transport.ask(f"{DM}:1700000000.000100", "push to main?", "req-42")

    (post,) = slack.wait_for_posts(1)
    assert post.payload["text"] == "push to main?"
    assert post.payload["thread_ts"] == "1700000000.000100"
    section, actions = post.payload["blocks"]
    assert section["text"]["text"] == "push to main?"
    buttons = [
        (b["action_id"], b["style"], b["value"], b["text"]["text"]) for b in actions["elements"]
    ]
    assert buttons == [
        ("kagura_approve", "primary", "req-42", "Approve"),
        ("kagura_deny", "danger", "req-42", "Deny"),
    ]


@pytest.mark.parametrize(
    ("thread_ts", "action_id", "answer"),
    [("1700000000.000100", "kagura_approve", "approve"), (None, "kagura_deny", "deny")],
)
def test_a_button_press_comes_back_as_an_answer(
    slack: FakeSlack, running: Running, thread_ts: str | None, action_id: str, answer: str
) -> None:
    thread = f"{DM}:{thread_ts}" if thread_ts else DM
    running.transport.ask(thread, "push to main?", "req-42")
    (post,) = slack.wait_for_posts(1)

    ack = slack.press(ALICE, DM, post.ts, action_id, "req-42")

    assert set(ack) == {"envelope_id"}
    # a press answers in the thread the question was asked in (or starts one under it)
    expected = f"{DM}:{thread_ts or post.ts}"
    assert running.next_event() == Event("slack", ALICE, expected, action=answer, request="req-42")


def test_the_stop_button_comes_back_as_a_kill(slack: FakeSlack, running: Running) -> None:
    running.transport.offer_stop(f"{DM}:1700000000.000100", "s-1 is running", "s-1")

    (post,) = slack.wait_for_posts(1)
    section, actions = post.payload["blocks"]
    assert section["text"]["text"] == "s-1 is running"
    (button,) = actions["elements"]
    assert (button["action_id"], button["style"], button["value"]) == (
        "kagura_kill",
        "danger",
        "s-1",
    )
    assert button["text"]["text"] == "❌ Stop"
    slack.press(ALICE, DM, post.ts, "kagura_kill", "s-1")
    assert running.next_event() == Event(
        "slack", ALICE, f"{DM}:1700000000.000100", action="kill", request="s-1"
    )


def test_attach_uploads_the_whole_text_as_a_file_in_the_thread(
    slack: FakeSlack, running: Running
) -> None:
    content = "".join(f"line {i}: ünïcode ✓\n" for i in range(5000))  # ~110 KB
    running.transport.attach(f"{DM}:1700000000.000100", "s-1-answer.md", content, "the answer")

    (upload,) = slack.wait_for_uploads(1)
    assert (upload.channel, upload.thread_ts) == (DM, "1700000000.000100")
    assert (upload.filename, upload.title, upload.initial_comment) == (
        "s-1-answer.md",
        "s-1-answer.md",
        "the answer",
    )
    assert upload.content.decode() == content  # whole, byte for byte
    assert [e["method"] for e in slack.ops("api")][-2:] == [
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ]


def test_a_refused_upload_is_a_setup_error_naming_the_scope(
    slack: FakeSlack, running: Running
) -> None:
    slack.missing_scopes.add("files.getUploadURLExternal")
    with pytest.raises(SetupError) as caught:
        running.transport.attach(f"{DM}:1", "x.md", "text", "comment")
    assert caught.value.message == "slack files.upload failed: missing_scope"
    assert "files:write" in caught.value.hint


def test_a_press_on_some_other_button_is_acked_and_ignored(
    slack: FakeSlack, running: Running
) -> None:
    assert "envelope_id" in slack.press(ALICE, DM, "1700000000.000100", "someone_else", "x")
    slack.send_message(ALICE, DM, "after")

    assert running.next_event().text == "after"


def test_a_failing_handler_is_reported_and_the_connection_lives_on(
    slack: FakeSlack, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: queue.Queue[Event] = queue.Queue()

    def handle(event: Event) -> None:
        if event.text == "boom":
            raise RuntimeError("handler bug")
        seen.put(event)

    transport = Running(slack, handle)
    slack.send_message(ALICE, DM, "boom")
    slack.send_message(ALICE, DM, "still there?")

    assert seen.get(timeout=5).text == "still there?"
    assert slack.connections == 1
    transport.stop()
    err = capsys.readouterr().err
    assert "the handler failed on an event" in err and "RuntimeError: handler bug" in err


def test_the_connection_survives_slacks_refresh(slack: FakeSlack, running: Running) -> None:
    slack.refresh()
    slack.send_message(ALICE, DM, "after the refresh")

    assert running.next_event().text == "after the refresh"
    assert slack.connections == 1


def test_stop_returns_run_promptly_and_closes_the_socket(
    slack: FakeSlack, running: Running
) -> None:
    assert running.stop() < 1.0
    deadline = time.monotonic() + 2
    while slack.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slack.connections == 0


def test_stop_before_run_makes_run_return_at_once(slack: FakeSlack) -> None:
    transport = SlackTransport(BOT_TOKEN, APP_TOKEN, base_url=slack.base_url)
    transport.stop()
    started = time.monotonic()
    transport.run(lambda event: None)
    assert time.monotonic() - started < 2.0


def _run_expecting_setup_error(slack: FakeSlack, bot_token: str, app_token: str) -> SetupError:
    transport = SlackTransport(bot_token, app_token, base_url=slack.base_url)
    started = time.monotonic()
    with pytest.raises(SetupError) as caught:
        transport.run(lambda event: None)
    assert time.monotonic() - started < 2.0, "a refusal must fail fast, not hang"
    return caught.value


def test_a_wrong_bot_token_is_a_setup_error_at_start(slack: FakeSlack) -> None:
    error = _run_expecting_setup_error(slack, "xoxb-wrong", APP_TOKEN)

    assert error.message == "slack auth.test failed: invalid_auth"
    assert "bot token" in error.hint
    assert [e["method"] for e in slack.ops("api")] == ["auth.test"]
    assert slack.connections == 0


def test_a_wrong_app_token_is_a_setup_error_at_start(slack: FakeSlack) -> None:
    error = _run_expecting_setup_error(slack, BOT_TOKEN, "xapp-wrong")

    assert error.message == "slack apps.connections.open failed: invalid_auth"
    assert "app-level token" in error.hint
    assert slack.connections == 0


def test_a_refused_websocket_is_a_setup_error_at_start(slack: FakeSlack) -> None:
    slack.refuse_websockets = True

    error = _run_expecting_setup_error(slack, BOT_TOKEN, APP_TOKEN)

    assert error.message == "the Slack Socket Mode WebSocket did not open"


def test_an_unreachable_slack_is_a_setup_error(slack: FakeSlack) -> None:
    url = slack.base_url
    slack.stop()
    transport = SlackTransport(BOT_TOKEN, APP_TOKEN, base_url=url)

    with pytest.raises(SetupError, match=r"^slack auth\.test failed: "):
        transport.run(lambda event: None)


def test_tokens_never_reach_logs_output_errors_or_the_wire_record(
    slack: FakeSlack,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)  # even with everything turned up
    running = Running(slack)
    slack.send_message(ALICE, DM, "hello")
    running.transport.ask(f"{DM}:1700000000.000100", "ok?", "req-1")
    (post,) = slack.wait_for_posts(1)
    slack.press(ALICE, DM, post.ts, "kagura_approve", "req-1")
    for _ in range(2):
        running.next_event()
    running.stop()
    errors = [
        _run_expecting_setup_error(slack, "xoxb-wrong", APP_TOKEN),
        _run_expecting_setup_error(slack, BOT_TOKEN, "xapp-wrong"),
    ]

    out, err = capfd.readouterr()
    seen = "\n".join(
        [caplog.text, out, err, repr(slack.posts), repr(slack.events), repr(slack.received)]
        + [e.render() for e in errors]
    )
    assert BOT_TOKEN not in seen and APP_TOKEN not in seen


def test_the_fake_speaks_form_and_json_and_refuses_unknown_methods(slack: FakeSlack) -> None:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    client = WebClient(token=BOT_TOKEN, base_url=slack.base_url)
    form = client.api_call("chat.postMessage", data={"channel": DM, "text": "as a form"})
    as_json = client.api_call("chat.postMessage", json={"channel": DM, "text": "as JSON"})
    updated = client.chat_update(channel=DM, ts=form["ts"], text="edited")

    assert form["ts"] != as_json["ts"] and updated["ts"] == form["ts"]
    assert [(p.method, p.payload["text"]) for p in slack.wait_for_posts(3)] == [
        ("chat.postMessage", "as a form"),
        ("chat.postMessage", "as JSON"),
        ("chat.update", "edited"),
    ]
    with pytest.raises(SlackApiError, match="unknown_method"):
        client.api_call("chat.nonsense")
    with pytest.raises(SlackApiError, match="invalid_auth"):
        WebClient(token=APP_TOKEN, base_url=slack.base_url).chat_postMessage(channel=DM, text="x")


def test_without_the_slack_extra_the_module_imports_and_construction_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocked = "import sys; sys.modules['slack_bolt'] = sys.modules['slack_sdk'] = None; "
    subprocess.run(
        [sys.executable, "-c", blocked + "import kagura_agent.cockpit.slack"],
        check=True,
    )
    monkeypatch.setitem(sys.modules, "slack_bolt", None)

    with pytest.raises(SetupError) as caught:
        SlackTransport(BOT_TOKEN, APP_TOKEN)
    assert caught.value.message == "the slack transport needs the slack extra"
    assert caught.value.hint == "pip install 'kagura-agent[slack]'"


@pytest.mark.docker
def test_serve_on_slack_launch_approve_apply(
    tmp_path: Any, state_dir: Any, docker_client: Any
) -> None:
    """`kagura-agent serve --transport slack` end to end: a DM launches a task, the plan and
    an Approve button land in its thread, a non-operator's press is refused, the operator's
    press runs apply in a real container, and the thread gets the outcome."""
    from apply_helpers import REPO, leftovers, make_project, manifest_set, run_ids, write_task

    project = make_project(tmp_path, "slacked")
    task = write_task(
        project, "slacked", {"steps": ["true"], "verify": ["true"], "egress": ["docs"]}
    )
    with FakeSlack(BOT_TOKEN, APP_TOKEN) as slack:
        manifests = manifest_set(
            tmp_path / "m",
            {
                "kind": "EgressPolicy",
                "metadata": {"name": "docs"},
                "spec": {"allow": [{"host": "docs.invalid"}]},
            },
            {
                "kind": "Transport",
                "metadata": {"name": "chat"},
                "spec": {
                    "type": "slack",
                    "token": "env:KAGURA_TEST_SLACK_BOT",
                    "app_token": "env:KAGURA_TEST_SLACK_APP",
                    "operators": [ALICE],
                    "base_url": slack.base_url,
                },
            },
        )
        env = {
            **os.environ,
            "NO_COLOR": "1",
            "KAGURA_TEST_SLACK_BOT": BOT_TOKEN,
            "KAGURA_TEST_SLACK_APP": APP_TOKEN,
        }
        serve = subprocess.Popen(
            [sys.executable, "-m", "kagura_agent", "serve", "--transport", "chat",
             "--manifests", str(manifests)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
        )  # fmt: skip
        try:
            slack.wait_for_connection(timeout=30)
            asked = "1700000000.000100"
            slack.send_message(ALICE, DM, f"launch {task}", ts=asked)
            posts = _wait_posts(slack, lambda p: "blocks" in p.payload)
            button = next(p for p in posts if "blocks" in p.payload)
            assert button.payload["thread_ts"] == asked
            request = button.payload["blocks"][-1]["elements"][0]["value"]
            slack.press("U0MALLORY", DM, button.ts, "kagura_approve", request)
            _wait_posts(slack, lambda p: "only this cockpit's operators may approve" in _text(p))
            slack.press(ALICE, DM, button.ts, "kagura_approve", request)
            done = _wait_posts(slack, lambda p: "(exit 0)" in _text(p), timeout=120)
            said = "\n".join(_text(p) for p in done)
            assert f"approved by slack:{ALICE}" in said
            assert all(p.payload.get("thread_ts") == asked for p in done)
        finally:
            serve.terminate()
            output = serve.communicate(timeout=60)[0]
    assert serve.returncode == 0, output
    for canary in (BOT_TOKEN, APP_TOKEN):
        assert canary not in output and canary not in said
    (run_id,) = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def _text(post: Any) -> str:
    return str(post.payload.get("text", ""))


def _wait_posts(slack: FakeSlack, found: Any, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        posts = list(slack.posts)
        if any(found(p) for p in posts):
            return posts
        assert time.monotonic() < deadline, "\n---\n".join(_text(p) for p in posts)
        time.sleep(0.05)


@pytest.mark.docker
def test_a_scripted_session_on_slack_long_answer_whole_and_a_stop(
    tmp_path: Any, state_dir: Any, docker_client: Any
) -> None:
    """serve on Slack, driven through the fake: the standing graduation proposal is posted
    to the operators' channel and approved there; `run say: 400` streams the assistant's text
    and its 400-line answer arrives whole as a file in the thread (nothing cut); a second
    session is launched, holds a lease, and its ❌ Stop button stops it: the thread says the
    lease was revoked and nothing of the run is left, and that is so."""
    from apply_helpers import REPO, cli_env, leftovers, live_leases, run_ids
    from chat_helpers import API_KEY, CANARY, long_answer_lines, session_world

    with FakeSlack(BOT_TOKEN, APP_TOKEN) as slack:
        transport = {
            "kind": "Transport",
            "metadata": {"name": "chat"},
            "spec": {
                "type": "slack",
                "token": "env:KAGURA_TEST_SLACK_BOT",
                "app_token": "env:KAGURA_TEST_SLACK_APP",
                "operators": [ALICE],
                "channel": "C0OPS",
                "base_url": slack.base_url,
            },
        }
        argv, env, stoppable = session_world(tmp_path, docker_client, transport)
        env.update(KAGURA_TEST_SLACK_BOT=BOT_TOKEN, KAGURA_TEST_SLACK_APP=APP_TOKEN)
        serve = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
        )
        try:
            slack.wait_for_connection(timeout=30)
            # The standing graduation proposal, in the operators' channel, approved there.
            proposal = _wait_posts(slack, lambda p: p.payload.get("channel") == "C0OPS", 60)[0]
            assert "egress:docs has earned it: 2 verified successes" in _text(proposal)
            request = proposal.payload["blocks"][-1]["elements"][0]["value"]
            slack.press(ALICE, "C0OPS", proposal.ts, "kagura_approve", request)
            _wait_posts(slack, lambda p: f"egress:docs graduated by slack:{ALICE}" in _text(p))
            asked = "1700000000.000100"
            slack.send_message(ALICE, DM, "run say: 400", ts=asked)
            (upload,) = slack.wait_for_uploads(1, timeout=180)
            _wait_posts(slack, lambda p: "(exit 0)" in _text(p), timeout=120)
            # Steering: a reply in a running session's thread reaches its brain.
            steered = "1700000000.000150"
            slack.send_message(ALICE, DM, "run run: sleep 6", ts=steered)
            _wait_posts(slack, lambda p: "▸ Bash: sleep 6" in _text(p), timeout=120)
            slack.send_message(ALICE, DM, "and also list the README", thread_ts=steered)
            _wait_posts(slack, lambda p: "Heard mid-run: and also list the README" in _text(p))
            stopping = "1700000000.000200"
            slack.send_message(ALICE, DM, f"launch {stoppable}", ts=stopping)

            def is_stop(post: Any) -> bool:
                return post.payload.get("thread_ts") == stopping and "kagura_stop" in json.dumps(
                    post.payload
                )

            stop = next(p for p in _wait_posts(slack, is_stop, 120) if is_stop(p))
            _wait_posts(slack, lambda p: "▸ bash: sleep 600" in _text(p), timeout=120)
            session = stop.payload["blocks"][-1]["elements"][0]["value"]
            slack.press(ALICE, DM, stop.ts, "kagura_kill", session)
            _wait_posts(slack, lambda p: "none left" in _text(p), timeout=120)
            said = "\n".join(_text(p) for p in slack.posts)
        finally:
            serve.terminate()
            output = serve.communicate(timeout=60)[0]
    assert serve.returncode == 0, output
    # The graduation: logged as the CLI logs it, by the operator, via slack.
    with StateStore() as store:
        (decision,) = [d for d in approvals.history(store) if d.kind == "graduation"]
    assert (decision.category, decision.outcome) == ("egress:docs", "approved")
    assert (decision.who, decision.via) == (f"slack:{ALICE}", "slack")
    # The long answer: a file in the run's thread, whole.
    assert upload.thread_ts == asked and upload.filename.endswith("-text-1.md")
    content = upload.content.decode()
    assert all(line in content for line in long_answer_lines())
    assert content.rstrip().endswith("END OF THE LONG ANSWER")
    assert "(" in upload.initial_comment and "whole in" in upload.initial_comment
    assert "✓ final answer: the text above" in said
    # The steering: the message reached the brain, in that session's thread.
    in_thread = "\n".join(_text(p) for p in slack.posts if p.payload.get("thread_ts") == steered)
    assert "↳ message 1 reached the brain as its next user message" in in_thread
    assert "💬 Heard mid-run: and also list the README" in in_thread
    # The stop.
    assert f"session {session}: stopping (asked by slack:{ALICE})" in said
    assert "leases: 1 revoked, none open; containers, networks and volumes: none left" in said
    stopped = [p for p in slack.posts if p.payload.get("thread_ts") == stopping]
    assert any("killed" in _text(p) and "(exit 130)" in _text(p) for p in stopped)
    for run_id in run_ids(state_dir):
        assert leftovers(docker_client, run_id) == []
    assert live_leases(cli_env(state_dir)) == []
    for canary in (BOT_TOKEN, APP_TOKEN, CANARY, API_KEY):
        assert canary not in output and canary not in said and canary not in content
