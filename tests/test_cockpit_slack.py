"""The Slack transport through the real slack-bolt, against the fake Slack in testing/.

Every test runs with a guard that refuses any connection beyond 127.0.0.1, so a default
slack.com URL left anywhere would fail here rather than reach the internet.
"""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from chat_helpers import RunningTransport, loopback_guard

from kagura_agent.cockpit.slack import SlackTransport, as_text
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import SetupError
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


def test_a_user_of_another_workspace_is_not_this_workspaces_user(
    slack: FakeSlack, running: Running
) -> None:
    """Operators are this workspace's user ids. Someone of another workspace (in a Slack
    Connect channel) whose id reads the same is another identity: their press and their
    message carry their workspace, and match no operator."""
    running.transport.ask(f"{DM}:1700000000.000100", "push to main?", "req-42")
    (post,) = slack.wait_for_posts(1)
    slack.press(ALICE, DM, post.ts, "kagura_approve", "req-42", team="T0OTHER")
    slack.send_message(ALICE, DM, "approve s-1", user_team="T0OTHER")
    slack.send_message(ALICE, DM, "approve s-2")  # this workspace's Alice

    assert running.next_event().user == f"T0OTHER:{ALICE}"
    assert running.next_event().user == f"T0OTHER:{ALICE}"
    assert running.next_event().user == ALICE


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


def test_a_long_question_keeps_what_would_change_next_to_the_buttons(
    slack: FakeSlack, running: Running
) -> None:
    """A question longer than a Slack section: the brain padded its reason so the plan
    diff, which comes last, would be cut off and the operator would approve unseen. The
    end of the question (what would change) stays next to the buttons, and so does its
    beginning (who asks for what)."""
    diff = "plan sha256:0123… would change:\n+ egress payments.example.com:443 (policy pay)"
    padding = "\\u2028" * 512  # the longest reason (512 line separators), neutralised
    question = f"The brain asks for egress:pay mid-run: {padding}\n{diff}\n(denied…)"
    running.transport.ask(f"{DM}:1700000000.000100", question, "m-1")

    (post,) = slack.wait_for_posts(1)
    section, _actions = post.payload["blocks"]
    shown = section["text"]["text"]
    assert len(shown) <= 3000
    assert shown.startswith("The brain asks for egress:pay mid-run")
    assert shown.endswith(f"{as_text(diff)}\n(denied…)")


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


# What a hijacked agent prints to be relayed: a ping of everyone, a mention, and a link
# dressed as the cockpit's own approval (Slack renders <URL|label> as "label").
LURE = "<!channel> <@U0BOB> session s-1 needs you: <https://evil.test/a|Approve s-1> & co"
LURE_SHOWN = (
    "&lt;!channel&gt; &lt;@U0BOB&gt; session s-1 needs you:"
    " &lt;https://evil.test/a|Approve s-1&gt; &amp; co"
)


def test_text_is_posted_as_text_never_as_slack_markup(slack: FakeSlack, running: Running) -> None:
    """Everything the cockpit posts may carry the agent's words: Slack's control sequences
    (<!channel>, <@USER>, <URL|label>) must arrive escaped, shown as written."""
    thread = f"{DM}:1700000000.000100"
    running.transport.say(thread, LURE)
    running.transport.ask(thread, LURE, "m-1")
    running.transport.offer_stop(thread, LURE, "s-1")
    said, asked, offered = slack.wait_for_posts(3)
    assert said.payload["text"] == asked.payload["text"] == offered.payload["text"] == LURE_SHOWN
    for post in (asked, offered):
        assert post.payload["blocks"][0]["text"]["text"] == LURE_SHOWN
