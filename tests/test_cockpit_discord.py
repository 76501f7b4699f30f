"""The Discord transport through the real discord.py, against the fake Discord in testing/.

Every test runs with a guard that refuses any connection beyond 127.0.0.1, so a default
discord.com URL left anywhere would fail here rather than reach the internet.
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

from kagura_agent.cockpit.discord import DiscordTransport
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import SetupError
from testing.fake_discord import MESSAGE_CONTENT, FakeDiscord

TOKEN = "MTEwMC5jYW5hcnk.discord-canary.7f3a9e"
ALICE = "2000000000000000001"
DM = "3000000000000000001"
GUILD, GENERAL = "4000000000000000001", "4000000000000000002"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from loopback_guard(monkeypatch)


@pytest.fixture()
def discord() -> Iterator[FakeDiscord]:
    with FakeDiscord(TOKEN) as fake:
        yield fake


class Running(RunningTransport):
    """The transport against this test's fake, running as the cockpit runs it."""

    def __init__(self, discord: FakeDiscord, handle: Any = None) -> None:
        super().__init__(
            DiscordTransport(TOKEN, base_url=discord.base_url), discord.wait_for_connection, handle
        )


@pytest.fixture()
def running(discord: FakeDiscord) -> Iterator[Running]:
    transport = Running(discord)
    yield transport
    if transport.thread.is_alive():
        transport.stop()


def test_login_asks_for_the_message_content_intent(discord: FakeDiscord, running: Running) -> None:
    (identify,) = discord.identified
    assert identify["intents"] & MESSAGE_CONTENT
    assert "token" not in identify  # the fake keeps no token
    assert [e["route"] for e in discord.ops("api")] == [
        "users/@me",
        "oauth2/applications/@me",
        "gateway/bot",
    ]


def test_a_direct_message_reaches_the_handler_without_the_mention(
    discord: FakeDiscord, running: Running
) -> None:
    message = discord.send_message(ALICE, DM, f"<@{discord.bot_user_id}> deploy the docs")

    assert running.next_event() == Event(
        transport="discord", user=ALICE, thread=f"{DM}:{message}", text="deploy the docs"
    )


def test_a_guild_channel_message_reaches_the_handler(
    discord: FakeDiscord, running: Running
) -> None:
    message = discord.send_message(ALICE, GENERAL, "status?", guild=GUILD)

    assert running.next_event() == Event("discord", ALICE, f"{GENERAL}:{message}", "status?")


def test_bot_messages_and_its_own_are_ignored(discord: FakeDiscord, running: Running) -> None:
    discord.send_message(discord.bot_user_id, DM, "I said this", bot=True)
    discord.send_message("2000000000000000099", DM, "beep", bot=True)
    discord.send_message(ALICE, DM, "a person")

    # dispatches reach the handler in order, so anything not ignored would come first
    assert running.next_event().text == "a person"
    assert running.events.empty()


def test_say_replies_to_the_threads_message_and_pings_nobody(
    discord: FakeDiscord, running: Running
) -> None:
    asked = discord.send_message(ALICE, DM, "hello")
    running.next_event()

    running.transport.say(f"{DM}:{asked}", "done: 3 files changed @everyone")

    (post,) = discord.wait_for_posts(1)
    assert post.channel == DM
    assert post.payload["content"] == "done: 3 files changed @everyone"
    assert post.payload["message_reference"]["message_id"] == int(asked)
    assert post.payload["allowed_mentions"] == {"parse": [], "replied_user": False}
    assert post.payload["components"] == []


def test_say_splits_text_longer_than_discord_takes(discord: FakeDiscord, running: Running) -> None:
    lines = [f"line {i:04d} " + "x" * 40 for i in range(100)]  # ~5000 characters

    running.transport.say(DM, "\n".join(lines))

    posts = discord.wait_for_posts(3)
    assert all(len(p.payload["content"]) <= 2000 for p in posts)
    assert "".join(p.payload["content"] for p in posts) == "\n".join(lines)
    assert all("message_reference" not in p.payload for p in posts)  # a bare channel


def test_ask_posts_approve_and_deny_buttons_carrying_the_request(
    discord: FakeDiscord, running: Running
) -> None:
    running.transport.ask(f"{DM}:1500000000000000001", "push to main?", "req-42")

    (post,) = discord.wait_for_posts(1)
    assert post.payload["content"] == "push to main?"
    (row,) = post.payload["components"]
    assert row["type"] == 1  # an action row
    buttons = [(b["type"], b["style"], b["label"], b["custom_id"]) for b in row["components"]]
    assert buttons == [
        (2, 3, "Approve", "kagura_approve:req-42"),  # a button; success (green)
        (2, 4, "Deny", "kagura_deny:req-42"),  # danger (red)
    ]


def test_a_reply_to_the_bots_answer_belongs_to_the_launch_thread(
    discord: FakeDiscord, running: Running
) -> None:
    """Discord has no threads here: a session's thread is its launch message, the bot
    answers by replying to it, and a person's reply to one of those answers (or to the
    launch itself) is in that thread — how a reply reaches a running session."""
    launch = discord.send_message(ALICE, DM, "run something long")
    assert running.next_event().thread == f"{DM}:{launch}"
    running.transport.say(f"{DM}:{launch}", "session s-1 is running")
    (answer,) = discord.wait_for_posts(1)

    discord.send_message(ALICE, DM, "and the README too", reply_to=answer.id)
    discord.send_message(ALICE, DM, "one more thing", reply_to=launch)
    discord.send_message(ALICE, DM, "status")

    first, second, third = running.next_event(), running.next_event(), running.next_event()
    assert (first.thread, first.text) == (f"{DM}:{launch}", "and the README too")
    assert (second.thread, second.text) == (f"{DM}:{launch}", "one more thing")
    assert third.thread != f"{DM}:{launch}"  # not a reply: a thread of its own


def test_the_stop_button_comes_back_as_a_kill(discord: FakeDiscord, running: Running) -> None:
    asked = discord.send_message(ALICE, DM, "launch task.yml")
    running.next_event()
    running.transport.offer_stop(f"{DM}:{asked}", "s-1 is running", "s-1")

    (post,) = discord.wait_for_posts(1)
    (row,) = post.payload["components"]
    (button,) = row["components"]
    assert (button["style"], button["label"], button["custom_id"]) == (4, "Stop", "kagura_kill:s-1")
    assert button["emoji"]["name"] == "❌"
    discord.press(ALICE, post.id, "kagura_kill:s-1")
    assert running.next_event() == Event(
        "discord", ALICE, f"{DM}:{asked}", action="kill", request="s-1"
    )


def test_attach_posts_the_whole_text_as_an_attachment_of_a_reply(
    discord: FakeDiscord, running: Running
) -> None:
    asked = discord.send_message(ALICE, DM, "run say: 5000")
    running.next_event()
    content = "".join(f"line {i}: ünïcode ✓\n" for i in range(5000))  # ~110 KB

    running.transport.attach(f"{DM}:{asked}", "s-1-answer.md", content, "the answer")

    (post,) = discord.wait_for_posts(1)
    assert post.payload["content"] == "the answer"
    assert post.payload["message_reference"]["message_id"] == int(asked)
    assert post.files == (("s-1-answer.md", content.encode()),)  # whole, byte for byte


@pytest.mark.parametrize(
    ("custom_id", "answer"), [("kagura_approve", "approve"), ("kagura_deny", "deny")]
)
def test_a_button_press_is_acknowledged_and_comes_back_as_an_answer(
    discord: FakeDiscord, running: Running, custom_id: str, answer: str
) -> None:
    asked = discord.send_message(ALICE, DM, "launch task.yml")
    running.next_event()
    running.transport.ask(f"{DM}:{asked}", "push to main?", "req-42")
    (post,) = discord.wait_for_posts(1)

    interaction = discord.press(ALICE, post.id, f"{custom_id}:req-42")

    # answered in the thread it was asked in: the question replies to the launch message
    assert running.next_event() == Event(
        "discord", ALICE, f"{DM}:{asked}", action=answer, request="req-42"
    )
    (callback,) = discord.wait_for_callbacks(1)
    assert callback.interaction == interaction
    assert callback.payload == {"type": 6}  # DEFERRED_UPDATE_MESSAGE: acked, message kept


def test_a_press_in_a_guild_channel_names_the_member(
    discord: FakeDiscord, running: Running
) -> None:
    running.transport.ask(GENERAL, "push to main?", "req-7")
    (post,) = discord.wait_for_posts(1)
    discord._messages[post.id]["guild_id"] = GUILD  # posted in a guild channel

    discord.press(ALICE, post.id, "kagura_approve:req-7")

    assert running.next_event() == Event(
        "discord", ALICE, f"{GENERAL}:{post.id}", action="approve", request="req-7"
    )


def test_a_press_on_some_other_button_is_acknowledged_and_ignored(
    discord: FakeDiscord, running: Running
) -> None:
    running.transport.ask(DM, "?", "req-1")
    (post,) = discord.wait_for_posts(1)

    discord.press(ALICE, post.id, "someone_else:req-1")
    discord.send_message(ALICE, DM, "after")

    assert running.next_event().text == "after"
    assert len(discord.wait_for_callbacks(1)) == 1


def test_a_failing_handler_is_reported_and_the_connection_lives_on(
    discord: FakeDiscord, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: queue.Queue[Event] = queue.Queue()

    def handle(event: Event) -> None:
        if event.text == "boom":
            raise RuntimeError("handler bug")
        seen.put(event)

    transport = Running(discord, handle)
    discord.send_message(ALICE, DM, "boom")
    discord.send_message(ALICE, DM, "still there?")

    assert seen.get(timeout=5).text == "still there?"
    assert discord.connections == 1
    transport.stop()
    err = capsys.readouterr().err
    assert "the handler failed on an event" in err and "RuntimeError: handler bug" in err


def test_a_refused_post_is_a_setup_error_for_the_caller(
    discord: FakeDiscord, running: Running
) -> None:
    discord.fail("POST", f"/api/v10/channels/{DM}/messages", 403)

    with pytest.raises(SetupError) as caught:
        running.transport.say(DM, "hello?")

    assert caught.value.message == (
        f"discord POST /channels/{DM}/messages failed: 403 injected failure 403"
    )
    assert "allowed to send messages" in caught.value.hint
    running.transport.say(DM, "and now?")  # the next post goes through
    assert [p.payload["content"] for p in discord.wait_for_posts(1)] == ["and now?"]


def test_stop_returns_run_promptly_and_closes_the_gateway(
    discord: FakeDiscord, running: Running
) -> None:
    assert running.stop() < 1.0
    deadline = time.monotonic() + 2
    while discord.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert discord.connections == 0


def test_stop_before_run_makes_run_return_at_once(discord: FakeDiscord) -> None:
    transport = DiscordTransport(TOKEN, base_url=discord.base_url)
    transport.stop()
    started = time.monotonic()
    transport.run(lambda event: None)
    assert time.monotonic() - started < 2.0


def test_say_without_a_connection_is_a_setup_error(discord: FakeDiscord) -> None:
    transport = DiscordTransport(TOKEN, base_url=discord.base_url)

    with pytest.raises(SetupError, match="the discord transport is not connected"):
        transport.say(DM, "hello?")


def _run_expecting_setup_error(discord: FakeDiscord, token: str, url: str = "") -> SetupError:
    transport = DiscordTransport(token, base_url=url or discord.base_url)
    started = time.monotonic()
    with pytest.raises(SetupError) as caught:
        transport.run(lambda event: None)
    assert time.monotonic() - started < 2.0, "a refusal must fail fast, not hang"
    return caught.value


def test_a_wrong_token_is_a_setup_error_at_start(discord: FakeDiscord) -> None:
    error = _run_expecting_setup_error(discord, "MTEw.wrong.token")

    assert error.message == "discord login failed: the token was refused"
    assert "bot token" in error.hint
    assert [e["route"] for e in discord.ops("api")] == ["users/@me"]
    assert discord.connections == 0


def test_a_refused_message_content_intent_is_a_setup_error(discord: FakeDiscord) -> None:
    discord.grant_message_content = False

    error = _run_expecting_setup_error(discord, TOKEN)

    assert error.message == "discord refused the message content intent"
    assert "Message Content Intent" in error.hint


def test_an_unreachable_discord_is_a_setup_error(discord: FakeDiscord) -> None:
    url = discord.base_url
    discord.stop()

    error = _run_expecting_setup_error(discord, TOKEN, url)

    assert error.message.startswith("discord login failed: ")


def test_the_api_root_is_per_transport_and_discord_py_is_left_as_it_was(
    discord: FakeDiscord, running: Running
) -> None:
    from discord.gateway import DiscordWebSocket
    from discord.http import Route
    from discord.webhook.async_ import AsyncWebhookAdapter, async_context

    running.transport.say(DM, "through the fake")
    assert discord.wait_for_posts(1)
    # the rebasing lives in the transport's client and loop, not in discord.py's globals
    assert Route.BASE == "https://discord.com/api/v10"
    assert str(DiscordWebSocket.DEFAULT_GATEWAY) == "wss://gateway.discord.gg/"
    assert type(async_context.get()) is AsyncWebhookAdapter


def test_tokens_never_reach_logs_output_errors_or_the_wire_record(
    discord: FakeDiscord,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)  # even with everything turned up
    running = Running(discord)
    asked = discord.send_message(ALICE, DM, "hello")
    running.next_event()
    running.transport.ask(f"{DM}:{asked}", "ok?", "req-1")
    (post,) = discord.wait_for_posts(1)
    discord.press(ALICE, post.id, "kagura_approve:req-1")
    running.next_event()
    running.stop()
    errors = [_run_expecting_setup_error(discord, TOKEN[:-1] + "x")]

    out, err = capfd.readouterr()
    seen = "\n".join(
        [caplog.text, out, err, repr(discord.posts), repr(discord.events)]
        + [repr(discord.identified), repr(discord.callbacks)]
        + [e.render() for e in errors]
    )
    assert "DEBUG" in caplog.text  # discord.py did log, at every level
    assert TOKEN not in seen and TOKEN[:-1] not in seen


def test_the_fake_refuses_a_missing_or_wrong_token_and_overlong_content(
    discord: FakeDiscord,
) -> None:
    import json
    import urllib.error
    import urllib.request

    def post(token: str | None, content: str) -> int:
        request = urllib.request.Request(
            f"{discord.base_url}/channels/{DM}/messages",
            data=json.dumps({"content": content}).encode(),
            headers={"Content-Type": "application/json"}
            | ({"Authorization": token} if token else {}),
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert post(None, "hi") == 401
    assert post(f"Bearer {TOKEN}", "hi") == 401
    assert post(f"Bot {TOKEN}", "x" * 2001) == 400
    assert post(f"Bot {TOKEN}", "") == 400
    assert post(f"Bot {TOKEN}", "hi") == 200


def test_without_the_discord_extra_the_module_imports_and_construction_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocked = "import sys; sys.modules['discord'] = None; "
    subprocess.run(
        [sys.executable, "-c", blocked + "import kagura_agent.cockpit.discord"],
        check=True,
    )
    monkeypatch.setitem(sys.modules, "discord", None)

    with pytest.raises(SetupError) as caught:
        DiscordTransport(TOKEN)
    assert caught.value.message == "the discord transport needs the discord extra"
    assert caught.value.hint == "pip install 'kagura-agent[discord]'"


def test_a_link_dressed_as_an_approval_is_shown_as_written(
    discord: FakeDiscord, running: Running
) -> None:
    """The cockpit relays the agent's words: a masked link ([label](url), rendered by
    Discord as a clickable "label") is escaped, so an agent cannot post an "Approve s-1"
    that leads elsewhere. Other markdown (the brain's **bold**, `code`) stays."""
    asked = discord.send_message(ALICE, DM, "hello")
    running.next_event()
    lure = "session s-1 needs you: [Approve s-1](https://evil.test/a) **now** `x`"
    running.transport.say(f"{DM}:{asked}", lure)
    running.transport.ask(f"{DM}:{asked}", lure, "m-1")
    said, question = discord.wait_for_posts(2)
    shown = "session s-1 needs you: \\[Approve s-1](https://evil.test/a) **now** `x`"
    assert said.payload["content"] == question.payload["content"] == shown
