"""The Slack transport: Socket Mode in and the Web API out, through slack-bolt.

    message / app_mention from a person   Event(text=..., thread="CHANNEL:THREAD_TS")
    press on kagura_approve / kagura_deny Event(action="approve"|"deny", request=value)
    press on kagura_kill                  Event(action="kill", request=value)
    say(thread, text)                     chat.postMessage in that thread
    ask(thread, text, request)            the same, with Approve / Deny buttons
    offer_stop(thread, text, request)     the same, with one ❌ Stop button
    attach(thread, name, content, comment)
                                          the content whole, as a file in that thread
                                          (files.getUploadURLExternal, the upload,
                                          files.completeUploadExternal: files:write)

Bolt acks each envelope as soon as its listener has queued the event; ``run`` then calls
``handle`` in its own thread, one event at a time and in arrival order, so a slow handler
never delays an ack and a failing one never drops the connection. slack_bolt is imported
only here, and only when a transport is made.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import socket
import sys
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kagura_agent.cockpit.transport import Event, Handler
from kagura_agent.errors import KaguraError, SetupError

APPROVE = "kagura_approve"
DENY = "kagura_deny"
KILL = "kagura_kill"
_ANSWERS = {APPROVE: "approve", DENY: "deny", KILL: "kill"}
# A person's message has no subtype, except a thread reply also sent to the channel and a
# message with a file; the rest (edits, deletions, joins, bot posts) are not commands.
_PERSON_SUBTYPES = frozenset({"", "thread_broadcast", "file_share"})
_SECTION_LIMIT = 3000  # Slack rejects a section block with longer text (invalid_blocks)
_REMEMBERED = 512  # message keys kept to drop an app_mention's twin message and redeliveries
_BOT_TOKEN_HINT = "check the bot token (xoxb-..., under OAuth & Permissions in the app's settings)"
_APP_TOKEN_HINT = (
    "check the app-level token (xapp-...); Socket Mode needs one with connections:write"
)

# slack_sdk dumps request bodies, the app token among them, when its logger is at DEBUG;
# pinning the level here keeps that out of whatever logging a host application sets up.
_log = logging.getLogger("kagura_agent.cockpit.slack")
_log.setLevel(logging.WARNING)


class SlackTransport:
    """A chat transport over one Slack app: a bot token (xoxb-) and an app token (xapp-)."""

    # Slack advises messages under 4,000 characters; chat.postMessage is limited to about
    # one message per second per channel (short bursts allowed).
    max_chars = 3900
    post_interval = 1.0

    def __init__(
        self, bot_token: str, app_token: str, *, base_url: str | None = None, name: str = "slack"
    ) -> None:
        try:
            import slack_bolt  # noqa: F401  (checked now so a missing extra fails early)
            from slack_sdk import WebClient
        except ImportError:
            raise SetupError(
                "the slack transport needs the slack extra",
                hint="pip install 'kagura-agent[slack]'",
            ) from None
        self.name = name
        self._app_token = app_token
        url = base_url or WebClient.BASE_URL
        self._client = WebClient(
            token=bot_token, base_url=url if url.endswith("/") else url + "/", logger=_log
        )
        self._bot_user = ""
        self._team = ""  # this workspace (auth.test): its user ids are the operators'
        self._inbox: queue.Queue[Event | None] = queue.Queue()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._seen_lock = threading.Lock()

    def run(self, handle: Handler) -> None:
        """Connect, then call ``handle`` for each inbound event until ``stop()``.

        A bad bot or app token, or a Socket Mode connection that does not open, is a
        SetupError raised here rather than a wait for events that never come.
        """
        from slack_bolt import App
        from slack_bolt.adapter.socket_mode import SocketModeHandler

        whoami = self._call("auth.test", self._client.auth_test, _BOT_TOKEN_HINT)
        self._bot_user = str(whoami["user_id"])
        self._team = str(whoami.get("team_id") or "")
        app = App(
            client=self._client,
            logger=_log,
            token_verification_enabled=False,  # done just above, to name Slack's error
            process_before_response=True,  # listeners only queue, so run them before the ack
        )
        app.event("message")(self._on_message)
        app.event("app_mention")(self._on_message)
        app.action(re.compile(".*"))(self._on_press)  # every press is acked, ours or not
        # One worker keeps envelopes in arrival order; the listeners only queue.
        socket_mode = SocketModeHandler(app, self._app_token, logger=_log, concurrency=1)
        try:
            self._call("apps.connections.open", socket_mode.connect, _APP_TOKEN_HINT)
            if not socket_mode.client.is_connected():
                raise SetupError(
                    "the Slack Socket Mode WebSocket did not open",
                    hint="the reason is logged above; check network access to Slack",
                )
            while (event := self._inbox.get()) is not None:
                self._deliver(handle, event)
        finally:
            _close(socket_mode)

    def stop(self) -> None:
        """Make ``run`` return (from any thread); it closes the socket on its way out."""
        self._inbox.put(None)

    def say(self, thread: str, text: str) -> None:
        """Post ``text`` in ``thread``."""
        self._post(thread, text=as_text(text))

    def ask(self, thread: str, text: str, request: str) -> None:
        """Post ``text`` in ``thread`` with Approve / Deny buttons that answer ``request``."""
        text = as_text(text)
        self._post(thread, text=text, blocks=approval_blocks(text, request))

    def offer_stop(self, thread: str, text: str, request: str) -> None:
        """Post ``text`` in ``thread`` with a ❌ Stop button that stops ``request``."""
        text = as_text(text)
        self._post(thread, text=text, blocks=stop_blocks(text, request))

    def attach(self, thread: str, filename: str, content: str, comment: str) -> None:
        """Post ``content`` whole as a file (a snippet) in ``thread``, with ``comment``."""
        channel, _, thread_ts = thread.partition(":")

        def upload() -> Any:
            return self._client.files_upload_v2(
                channel=channel,
                thread_ts=thread_ts or None,
                content=content,
                filename=filename,
                title=filename,
                initial_comment=as_text(comment),
            )

        self._call("files.upload", upload, "the bot needs the files:write scope")

    # -- Slack to events ---------------------------------------------------------------

    def _on_message(self, event: dict[str, Any]) -> None:
        user = event.get("user")
        if event.get("subtype", "") not in _PERSON_SUBTYPES or event.get("bot_id"):
            return
        if not user or user == self._bot_user:
            return
        channel, ts = event.get("channel", ""), event.get("ts", "")
        if not self._first_sighting(f"{channel}:{ts}"):
            return
        text = _strip_mention(event.get("text") or "", self._bot_user)
        who = self._identity(str(user), event.get("user_team") or event.get("team"))
        self._inbox.put(Event(self.name, who, f"{channel}:{event.get('thread_ts') or ts}", text))

    def _on_press(
        self, ack: Callable[[], None], body: dict[str, Any], action: dict[str, Any]
    ) -> None:
        ack()
        answer = _ANSWERS.get(action.get("action_id", ""))
        user = (body.get("user") or {}).get("id")
        if answer is None or not user:
            return
        container = body.get("container") or {}
        message = body.get("message") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id", "")
        ts = message.get("thread_ts") or message.get("ts") or container.get("message_ts", "")
        team = (body.get("user") or {}).get("team_id") or (body.get("team") or {}).get("id")
        self._inbox.put(
            Event(
                self.name,
                self._identity(str(user), team),
                f"{channel}:{ts}",
                action=answer,
                request=action.get("value", ""),
            )
        )

    def _identity(self, user: str, team: Any) -> str:
        """``user`` as the cockpit knows them: a user id of this workspace as is; someone
        of another workspace (a Slack Connect channel) as TEAM:USER, which no operator id
        (this workspace's) matches, whatever their id reads."""
        if team and self._team and str(team) != self._team:
            return f"{team}:{user}"
        return user

    def _first_sighting(self, key: str) -> bool:
        with self._seen_lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > _REMEMBERED:
                self._seen.popitem(last=False)
            return True

    def _deliver(self, handle: Handler, event: Event) -> None:
        try:
            handle(event)
        except KaguraError as exc:
            print(f"{self.name}: {exc.render()}", file=sys.stderr)
        except Exception:
            print(f"{self.name}: the handler failed on an event; carrying on", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)

    # -- events to Slack ---------------------------------------------------------------

    def _post(self, thread: str, **message: Any) -> None:
        channel, _, thread_ts = thread.partition(":")

        def post() -> Any:
            return self._client.chat_postMessage(
                channel=channel, thread_ts=thread_ts or None, **message
            )

        self._call("chat.postMessage", post, "is the bot in that channel?")

    def _call(self, method: str, call: Callable[[], Any], hint: str = "") -> Any:
        """Run one Web API call, translating slack_sdk's errors into SetupError."""
        from slack_sdk.errors import SlackApiError, SlackClientError

        try:
            return call()
        except SlackApiError as exc:
            error = str(exc.response.get("error", "unknown_error"))
            raise SetupError(f"slack {method} failed: {error}", hint=hint) from None
        except (SlackClientError, OSError) as exc:  # unreachable, timed out, not JSON
            raise SetupError(f"slack {method} failed: {exc}", hint=hint) from None


def _close(socket_mode: Any) -> None:
    """Close the Socket Mode connection now. slack_sdk's close() joins two threads that
    wait out timeouts: the receiver in recv() (up to 3 s) and the dispatcher on its queue
    (up to 1 s). Shutting the TCP socket down wakes the first; a None on the queue, which
    the dispatcher skips, wakes the second once ``closed`` tells it to leave."""
    client = socket_mode.client
    session = client.current_session
    sock = session.sock if session is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed by slack_sdk: fine
            sock.shutdown(socket.SHUT_RDWR)
    client.closed = True  # before the None: the dispatcher it wakes must see it and leave
    client.message_queue.put(None)
    socket_mode.close()


def as_text(text: str) -> str:
    """``text`` shown as written: Slack's three control characters escaped, so no
    ``<!channel>``, ``<@USER>`` or ``<URL|label>`` the agent wrote is acted on or rendered
    (the cockpit relays the agent's words; it posts no Slack markup of its own)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def approval_blocks(text: str, request: str) -> list[dict[str, Any]]:
    """Block Kit for an approval: the text, then Approve / Deny buttons carrying ``request``."""
    text = _fit(text)
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "actions",
            "block_id": "kagura_approval",
            "elements": [
                _button("Approve", APPROVE, "primary", request),
                _button("Deny", DENY, "danger", request),
            ],
        },
    ]


def stop_blocks(text: str, request: str) -> list[dict[str, Any]]:
    """Block Kit for a running session: the text, then one ❌ Stop button carrying ``request``."""
    text = _fit(text)
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "actions",
            "block_id": "kagura_stop",
            "elements": [_button("❌ Stop", KILL, "danger", request)],
        },
    ]


def _fit(text: str) -> str:
    """``text`` within one section. A question ends with what the operator decides on (the
    plan diff) and begins with who asks for what; what is cut is the middle, where the
    agent's words are (a padded reason must not push the diff out of sight)."""
    if len(text) <= _SECTION_LIMIT:
        return text
    cut = "\n…(cut)…\n"
    head = _SECTION_LIMIT // 4
    return text[:head] + cut + text[-(_SECTION_LIMIT - head - len(cut)) :]


def _button(label: str, action_id: str, style: str, value: str) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action_id,
        "style": style,
        "value": value,
    }


def _strip_mention(text: str, bot_user: str) -> str:
    """``<@BOT> do it`` -> ``do it``: the mention is how a channel addresses the bot."""
    if not bot_user:
        return text
    return re.sub(rf"^\s*<@{re.escape(bot_user)}(?:\|[^>]*)?>[\s:,]*", "", text, count=1)
