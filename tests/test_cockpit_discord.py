"""The Discord transport through the real discord.py, against the fake Discord in testing/.

Every test runs with a guard that refuses any connection beyond 127.0.0.1, so a default
discord.com URL left anywhere would fail here rather than reach the internet.
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from chat_helpers import RunningTransport, loopback_guard

from kagura_agent import approvals
from kagura_agent.cockpit.discord import DiscordTransport
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import SetupError
from kagura_agent.state import StateStore
from testing.fake_discord import MESSAGE_CONTENT, FakeDiscord

TOKEN = "MTEwMC5jYW5hcnk.discord-canary.7f3a9e"
ALICE = "2000000000000000001"
DM = "3000000000000000001"
GUILD, GENERAL = "4000000000000000001", "4000000000000000002"
OPS = "3000000000000000009"  # the operators' channel


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


@pytest.mark.docker
def test_serve_on_discord_launch_approve_apply(
    tmp_path: Any, state_dir: Any, docker_client: Any
) -> None:
    """`kagura-agent serve --transport discord` end to end, as with Slack: a DM launches,
    the question carries buttons, a stranger's press is refused, the operator's runs apply
    in a real container, and the outcome is a reply in the same thread."""
    import os

    from apply_helpers import REPO, leftovers, make_project, manifest_set, run_ids, write_task

    project = make_project(tmp_path, "discorded")
    task = write_task(
        project, "discorded", {"steps": ["true"], "verify": ["true"], "egress": ["docs"]}
    )
    with FakeDiscord(TOKEN) as fake:
        manifests = manifest_set(
            tmp_path / "m",
            {"kind": "EgressPolicy", "metadata": {"name": "docs"}, "spec": {"allow": [{"host": "docs.invalid"}]}},
            {
                "kind": "Transport",
                "metadata": {"name": "dc"},
                "spec": {
                    "type": "discord",
                    "token": "env:KAGURA_TEST_DISCORD",
                    "operators": [ALICE],
                    "base_url": fake.base_url,
                },
            },
        )  # fmt: skip
        env = {**os.environ, "NO_COLOR": "1", "KAGURA_TEST_DISCORD": TOKEN}
        serve = subprocess.Popen(
            [sys.executable, "-m", "kagura_agent", "serve", "--transport", "dc",
             "--manifests", str(manifests)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
        )  # fmt: skip
        try:
            fake.wait_for_connection(timeout=30)
            asked = fake.send_message(ALICE, DM, f"launch {task}")
            button = _wait_post(fake, lambda p: bool(p.payload.get("components")))
            request = button.payload["components"][0]["components"][0]["custom_id"]
            fake.press("2200000000000000666", button.id, request)
            _wait_post(fake, lambda p: "only this cockpit's operators may approve" in _content(p))
            fake.press(ALICE, button.id, request)
            _wait_post(fake, lambda p: "(exit 0)" in _content(p), timeout=120)
            said = "\n".join(_content(p) for p in fake.posts)
            assert f"approved by discord:{ALICE}" in said
            replies = {
                str((p.payload.get("message_reference") or {}).get("message_id"))
                for p in fake.posts
            }
            assert replies == {asked}  # every answer is a reply in the launch's thread
        finally:
            serve.terminate()
            output = serve.communicate(timeout=60)[0]
    assert serve.returncode == 0, output
    assert TOKEN not in output and TOKEN not in said
    (run_id,) = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def _content(post: Any) -> str:
    return str(post.payload.get("content", ""))


def _wait_post(fake: FakeDiscord, found: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        for post in list(fake.posts):
            if found(post):
                return post
        assert time.monotonic() < deadline, "\n---\n".join(_content(p) for p in fake.posts)
        time.sleep(0.05)


@pytest.mark.docker
def test_a_scripted_session_on_discord_long_answer_whole_and_a_stop(
    tmp_path: Any, state_dir: Any, docker_client: Any
) -> None:
    """As on Slack: the graduation proposal approved in the operators' channel; `run say: 400`'s answer arrives whole as an attachment of a reply in
    the thread; a leased run's ❌ Stop button stops it and the thread says what was left."""
    from apply_helpers import REPO, cli_env, leftovers, live_leases, run_ids
    from chat_helpers import API_KEY, CANARY, long_answer_lines, session_world

    with FakeDiscord(TOKEN) as fake:
        transport = {
            "kind": "Transport",
            "metadata": {"name": "dc"},
            "spec": {
                "type": "discord",
                "token": "env:KAGURA_TEST_DISCORD",
                "operators": [ALICE],
                "channel": OPS,
                "base_url": fake.base_url,
            },
        }
        argv, env, stoppable = session_world(tmp_path, docker_client, transport)
        env.update(KAGURA_TEST_DISCORD=TOKEN)
        serve = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
        )
        try:
            fake.wait_for_connection(timeout=30)
            # The standing graduation proposal, in the operators' channel, approved there.
            proposal = _wait_post(fake, lambda p: p.channel == OPS, 60)
            assert "egress:docs has earned it: 2 verified successes" in _content(proposal)
            approve = proposal.payload["components"][0]["components"][0]["custom_id"]
            fake.press(ALICE, proposal.id, approve)
            _wait_post(fake, lambda p: f"egress:docs graduated by discord:{ALICE}" in _content(p))
            asked = fake.send_message(ALICE, DM, "run say: 400")
            attached = _wait_post(fake, lambda p: bool(p.files), timeout=180)
            _wait_post(fake, lambda p: "(exit 0)" in _content(p), timeout=120)
            # Steering: a reply to the running session's answer reaches its brain.
            steered = fake.send_message(ALICE, DM, "run run: sleep 6")
            running_post = _wait_post(fake, lambda p: "▸ Bash: sleep 6" in _content(p), 120)
            fake.send_message(ALICE, DM, "and also list the README", reply_to=running_post.id)
            _wait_post(fake, lambda p: "Heard mid-run: and also list the README" in _content(p))
            stopping = fake.send_message(ALICE, DM, f"launch {stoppable}")
            stop = _wait_post(
                fake,
                lambda p: (
                    "kagura_kill:" in json.dumps(p.payload)
                    and str(p.payload["message_reference"]["message_id"]) == stopping
                ),
                120,
            )
            _wait_post(fake, lambda p: "▸ bash: sleep 600" in _content(p), timeout=120)
            custom_id = stop.payload["components"][0]["components"][0]["custom_id"]
            fake.press(ALICE, stop.id, custom_id)
            _wait_post(fake, lambda p: "none left" in _content(p), timeout=120)
            said = "\n".join(_content(p) for p in fake.posts)
        finally:
            serve.terminate()
            output = serve.communicate(timeout=60)[0]
    assert serve.returncode == 0, output
    with StateStore() as store:
        (decision,) = [d for d in approvals.history(store) if d.kind == "graduation"]
    assert (decision.category, decision.outcome) == ("egress:docs", "approved")
    assert (decision.who, decision.via) == (f"discord:{ALICE}", "discord")
    (name, data), *_ = attached.files
    content = data.decode()
    assert name.endswith("-text-1.md")
    assert attached.payload["message_reference"]["message_id"] == int(asked)
    assert all(line in content for line in long_answer_lines())
    assert content.rstrip().endswith("END OF THE LONG ANSWER")
    assert "✓ final answer: the text above" in said
    in_thread = "\n".join(
        _content(p) for p in fake.posts
        if str((p.payload.get("message_reference") or {}).get("message_id")) == steered
    )  # fmt: skip
    assert "↳ message 1 reached the brain as its next user message" in in_thread
    assert "💬 Heard mid-run: and also list the README" in in_thread
    session = custom_id.partition(":")[2]
    assert f"session {session}: stopping (asked by discord:{ALICE})" in said
    assert "leases: 1 revoked, none open; containers, networks and volumes: none left" in said
    stopped = [
        p for p in fake.posts
        if str((p.payload.get("message_reference") or {}).get("message_id")) == stopping
    ]  # fmt: skip
    assert any("killed" in _content(p) and "(exit 130)" in _content(p) for p in stopped)
    for run_id in run_ids(state_dir):
        assert leftovers(docker_client, run_id) == []
    assert live_leases(cli_env(state_dir)) == []
    for canary in (TOKEN, CANARY, API_KEY):
        assert canary not in output and canary not in said and canary not in content
