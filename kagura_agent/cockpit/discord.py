"""The Discord transport: the Gateway in and the REST API out, through discord.py.

    message from a person (DM or channel)  Event(text=..., thread="CHANNEL:MESSAGE")
    press on kagura_approve:REQUEST / kagura_deny:REQUEST
                                           Event(action="approve"|"deny", request=REQUEST)
    press on kagura_kill:REQUEST           Event(action="kill", request=REQUEST)
    say(thread, text)                      a reply to MESSAGE in CHANNEL
    ask(thread, text, request)             the same, with Approve / Deny buttons
    offer_stop(thread, text, request)      the same, with one ❌ Stop button
    attach(thread, name, content, comment) the content whole, as an attachment to a reply

discord.py is asyncio: ``run`` starts the client on its own event loop in a thread of its
own, and calls ``handle`` in the calling thread, one event at a time and in arrival order,
so a slow handler never stalls the Gateway. ``say`` and ``ask`` may be called from any
thread. discord.py is imported only here, and only when a transport is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import sys
import threading
import traceback
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from kagura_agent.cockpit.transport import Event, Handler
from kagura_agent.errors import KaguraError, SetupError

APPROVE = "kagura_approve"
DENY = "kagura_deny"
KILL = "kagura_kill"
_ANSWERS = {APPROVE: "approve", DENY: "deny", KILL: "kill"}
_CONTENT_LIMIT = 2000  # Discord refuses a longer message content (50035 Invalid Form Body)
_READY_TIMEOUT = 30.0  # seconds from login to the Gateway's READY
_CALL_TIMEOUT = 30.0  # seconds for one say / ask
_TOKEN_HINT = "check the bot token (Bot > Reset Token in the Discord developer portal)"
_INTENT_HINT = "enable Message Content Intent under Bot in the Discord developer portal"

T = TypeVar("T")


class _Lost:
    """Put in the inbox when the Gateway connection ends for good."""

    def __init__(self, error: SetupError) -> None:
        self.error = error


class DiscordTransport:
    """A chat transport over one Discord bot: its token and, for tests, another API root."""

    max_chars = _CONTENT_LIMIT
    post_interval = 1.0  # Discord allows 5 messages per 5 seconds in a channel

    def __init__(
        self, bot_token: str, *, base_url: str | None = None, name: str = "discord"
    ) -> None:
        try:
            import discord  # noqa: F401  (checked now so a missing extra fails early)
        except ImportError:
            raise SetupError(
                "the discord transport needs the discord extra",
                hint="pip install 'kagura-agent[discord]'",
            ) from None
        self.name = name
        self._token = bot_token
        self._base_url = base_url.rstrip("/") if base_url else None
        self._inbox: queue.Queue[Event | _Lost | None] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._closing: asyncio.Future[None] | None = None  # kept, so it is not collected
        self._bot_user = ""

    def run(self, handle: Handler) -> None:
        """Log in, connect, then call ``handle`` for each inbound event until ``stop()``.

        A bad token, an unreachable Discord or a Gateway that does not become ready is a
        SetupError raised here rather than a wait for events that never come.
        """
        started: queue.Queue[SetupError | None] = queue.Queue()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._serve, args=(loop, started), name=f"{self.name}-gateway", daemon=True
        )
        thread.start()
        try:
            failure = started.get()
            if failure is not None:
                raise failure
            while (event := self._inbox.get()) is not None:
                if isinstance(event, _Lost):
                    raise event.error
                self._deliver(handle, event)
        finally:
            self._loop = None
            with contextlib.suppress(RuntimeError):  # raised when the loop is closed already
                loop.call_soon_threadsafe(self._close_client)
            thread.join(10)

    def stop(self) -> None:
        """Make ``run`` return (from any thread); it closes the connection on its way out."""
        self._inbox.put(None)

    def say(self, thread: str, text: str) -> None:
        """Post ``text`` in ``thread`` (as replies to its message, split at Discord's limit)."""
        self._call(self._send(thread, text, None))

    def ask(self, thread: str, text: str, request: str) -> None:
        """Post ``text`` in ``thread`` with Approve / Deny buttons that answer ``request``."""
        self._call(self._send(thread, text, request))

    def offer_stop(self, thread: str, text: str, request: str) -> None:
        """Post ``text`` in ``thread`` with a ❌ Stop button that stops ``request``."""
        self._call(self._send(thread, text, request, view=stop_view))

    def attach(self, thread: str, filename: str, content: str, comment: str) -> None:
        """Post ``content`` whole as an attachment of a reply in ``thread``."""
        self._call(self._send(thread, comment, None, file=(filename, content.encode())))

    # -- the client's thread -----------------------------------------------------------

    def _serve(
        self, loop: asyncio.AbstractEventLoop, started: queue.Queue[SetupError | None]
    ) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._connect(started))
        finally:
            started.put(SetupError("the discord client stopped before it was ready"))
            # as asyncio.run does: discord.py leaves tasks (such as its wait for guilds)
            # that must finish on this loop, not be collected after it closed
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _connect(self, started: queue.Queue[SetupError | None]) -> None:
        import discord

        intents = discord.Intents.default()
        intents.message_content = True  # a command is a message's text
        client: Any = discord.Client(intents=intents)  # given listeners below
        self._client = client
        if self._base_url is not None:
            _rebase(client, self._base_url)
        connected = asyncio.Event()

        async def on_connect() -> None:  # READY arrived (on_ready waits out guild loading)
            connected.set()

        # discord.py calls a client's on_<event> attributes
        client.on_message, client.on_interaction = (
            self._on_message_event,
            self._on_interaction_event,
        )
        client.on_connect = on_connect
        try:
            async with asyncio.timeout(_READY_TIMEOUT):  # a silent server is not a hang
                await self._translate(client.login(self._token), "login", _TOKEN_HINT)
                if self._base_url is not None:
                    _, url, _ = await self._translate(
                        client.http.get_bot_gateway(), "GET /gateway/bot", _TOKEN_HINT
                    )
                    client.http.gateway_url = url
            self._bot_user = str(client.user.id)
            self._loop = asyncio.get_running_loop()  # logged in: say and ask can post
            connection = asyncio.ensure_future(client.connect(reconnect=True))
            ready = asyncio.ensure_future(connected.wait())
            done, _ = await asyncio.wait(
                {connection, ready}, timeout=_READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
            )
            if ready not in done:
                ready.cancel()
                await client.close()
                error = connection.exception() if connection in done else None
                raise _setup_error("Gateway connect", error)
        except (SetupError, TimeoutError) as exc:
            self._loop = None
            started.put(exc if isinstance(exc, SetupError) else _setup_error("login", None))
            with contextlib.suppress(Exception):
                await client.close()
            return
        started.put(None)
        try:
            await connection
        except Exception as exc:
            self._inbox.put(_Lost(_setup_error("Gateway connection", exc)))
        else:
            self._inbox.put(_Lost(SetupError("the discord client closed")))
        finally:
            await client.close()  # waits for a close already under way to finish

    def _close_client(self) -> None:
        """On the client's loop: start closing, which ends ``_connect``'s wait."""
        if self._client is not None and not self._client.is_closed():
            self._closing = asyncio.ensure_future(self._client.close())

    async def _translate(self, call: Awaitable[T], what: str, hint: str) -> T:
        import aiohttp
        import discord

        try:
            return await call
        except discord.LoginFailure:
            raise SetupError(f"discord {what} failed: the token was refused", hint=hint) from None
        except (discord.DiscordException, aiohttp.ClientError, OSError) as exc:
            raise _setup_error(what, exc, hint) from None

    # -- Discord to events -------------------------------------------------------------

    async def _on_message_event(self, message: Any) -> None:
        self._on_message(message)

    async def _on_interaction_event(self, interaction: Any) -> None:
        import discord

        if interaction.type is not discord.InteractionType.component:
            return
        with contextlib.suppress(discord.HTTPException):  # acked or expired: nothing to do
            await interaction.response.defer()  # within Discord's 3 s, before any handling
        self._on_press(interaction)

    def _on_message(self, message: Any) -> None:
        author = message.author
        if author.bot or author.system or str(author.id) == self._bot_user:
            return
        if message.type.value not in (0, 19):  # DEFAULT and REPLY are what people type
            return
        text = _strip_mention(message.content or "", self._bot_user)
        thread = f"{message.channel.id}:{self._anchor(message)}"
        self._inbox.put(Event(self.name, str(author.id), thread, text))

    def _anchor(self, message: Any) -> Any:
        """The message a thread hangs on: a reply to one of the bot's answers belongs to
        the message that answer replies to (a session's launch), a reply to a person's
        message to that message; anything else starts a thread of its own."""
        reference = message.reference
        if reference is None or reference.message_id is None:
            return message.id
        replied = reference.resolved
        own = getattr(getattr(replied, "author", None), "id", None)
        if replied is not None and str(own) == self._bot_user and replied.reference is not None:
            return replied.reference.message_id or reference.message_id
        return reference.message_id

    def _on_press(self, interaction: Any) -> None:
        custom_id = str((interaction.data or {}).get("custom_id", ""))
        prefix, _, request = custom_id.partition(":")
        answer = _ANSWERS.get(prefix)
        if answer is None or not request or interaction.user is None:
            return
        message = interaction.message
        asked = message.reference.message_id if message and message.reference else None
        anchor = asked or (message.id if message else None)
        thread = f"{interaction.channel_id}:{anchor}" if anchor else str(interaction.channel_id)
        self._inbox.put(
            Event(self.name, str(interaction.user.id), thread, action=answer, request=request)
        )

    def _deliver(self, handle: Handler, event: Event) -> None:
        try:
            handle(event)
        except KaguraError as exc:
            print(f"{self.name}: {exc.render()}", file=sys.stderr)
        except Exception:
            print(f"{self.name}: the handler failed on an event; carrying on", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)

    # -- events to Discord -------------------------------------------------------------

    async def _send(
        self,
        thread: str,
        text: str,
        request: str | None,
        *,
        view: Any = None,
        file: tuple[str, bytes] | None = None,
    ) -> None:
        import io

        import discord

        make_view = view or approval_view

        channel_id, _, message_id = thread.partition(":")
        channel = self._client.get_partial_messageable(int(channel_id))
        reference = (
            channel.get_partial_message(int(message_id)).to_reference(fail_if_not_exists=False)
            if message_id
            else None
        )
        chunks = _chunks(as_text(text))
        for index, chunk in enumerate(chunks):
            extra: dict[str, Any] = {}
            last = index == len(chunks) - 1
            if request is not None and last:
                extra["view"] = make_view(request)
            if file is not None and last:
                extra["file"] = discord.File(io.BytesIO(file[1]), filename=file[0])
            await self._translate(
                channel.send(
                    chunk,
                    reference=reference,
                    mention_author=False,
                    allowed_mentions=discord.AllowedMentions.none(),
                    **extra,
                ),
                f"POST /channels/{channel_id}/messages",
                "is the bot in that channel, and allowed to send messages there?",
            )

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None:
            coro.close()
            raise SetupError(f"the {self.name} transport is not connected")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            future.result(_CALL_TIMEOUT)
        except TimeoutError:
            future.cancel()
            raise SetupError(f"discord did not answer within {_CALL_TIMEOUT:.0f}s") from None


def approval_view(request: str) -> Any:
    """Approve / Deny buttons carrying ``request`` in their custom_id (up to 100 chars).

    The view is stopped before it is sent: presses are read in ``on_interaction`` by their
    custom_id, so they are answered even after a restart and no view piles up in memory.
    """
    import discord

    view = discord.ui.View(timeout=None)
    for label, action, style in (
        ("Approve", APPROVE, discord.ButtonStyle.success),
        ("Deny", DENY, discord.ButtonStyle.danger),
    ):
        view.add_item(discord.ui.Button(label=label, style=style, custom_id=f"{action}:{request}"))
    view.stop()
    return view


def stop_view(request: str) -> Any:
    """One ❌ Stop button carrying ``request`` (read by custom_id, as approval_view's)."""
    import discord

    view = discord.ui.View(timeout=None)
    view.add_item(
        discord.ui.Button(
            label="Stop",
            emoji="❌",
            style=discord.ButtonStyle.danger,
            custom_id=f"{KILL}:{request}",
        )
    )
    view.stop()
    return view


def _rebase(client: Any, base_url: str) -> None:
    """Point one client's REST calls at ``base_url`` and its Gateway at the URL that API
    gives. discord.py has no per-client setting: ``Route.BASE`` and the default gateway are
    class attributes, and setting them would move every client in the process. So the two
    places this client's requests leave through rewrite discord.com into ``base_url``."""
    from discord.gateway import DiscordWebSocket
    from discord.http import Route
    from discord.webhook.async_ import AsyncWebhookAdapter, async_context

    http = client.http
    request, ws_connect = http.request, http.ws_connect
    http.gateway_url = str(DiscordWebSocket.DEFAULT_GATEWAY)

    def rebased(route: Any) -> Any:
        if route.url.startswith(Route.BASE):
            route.url = base_url + route.url[len(Route.BASE) :]
        return route

    async def request_rebased(route: Any, **kwargs: Any) -> Any:
        return await request(rebased(route), **kwargs)

    async def ws_connect_rebased(url: str, **kwargs: Any) -> Any:
        default = str(DiscordWebSocket.DEFAULT_GATEWAY).rstrip("/")
        if url.startswith(default):
            url = http.gateway_url.rstrip("/") + url[len(default) :]
        return await ws_connect(url, **kwargs)

    class Adapter(AsyncWebhookAdapter):  # interaction answers go through the webhook adapter
        async def request(self, route: Any, *args: Any, **kwargs: Any) -> Any:
            return await super().request(rebased(route), *args, **kwargs)

    http.request, http.ws_connect = request_rebased, ws_connect_rebased
    # a context variable: it holds for this client's tasks, which all descend from here
    adapter: Any = Adapter  # discord.py leaves its __init__ unannotated
    async_context.set(adapter())


def _setup_error(what: str, exc: BaseException | None, hint: str = "") -> SetupError:
    import discord

    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return SetupError("discord refused the message content intent", hint=_INTENT_HINT)
    if isinstance(exc, discord.ConnectionClosed) and exc.code == 4004:
        return SetupError(f"discord {what} failed: the token was refused", hint=_TOKEN_HINT)
    if isinstance(exc, discord.HTTPException):
        detail = f"{exc.status} {exc.text or exc.response.reason}".strip()
        return SetupError(f"discord {what} failed: {detail}", hint=hint)
    if exc is None:
        return SetupError(f"discord {what} failed: not ready within {_READY_TIMEOUT:.0f}s")
    if isinstance(exc, discord.DiscordException | OSError) or type(exc).__module__.startswith(
        "aiohttp"
    ):
        return SetupError(f"discord {what} failed: {exc or type(exc).__name__}", hint=hint)
    return SetupError(f"discord {what} failed: {type(exc).__name__}: {exc}", hint=hint)


def _chunks(text: str) -> list[str]:
    """Split ``text`` into messages Discord takes, at line ends where one is near."""
    text = text or "\u200b"  # an empty content is refused; a zero-width space is not
    chunks = []
    while len(text) > _CONTENT_LIMIT:
        cut = text.rfind("\n", _CONTENT_LIMIT // 2, _CONTENT_LIMIT)
        cut = cut + 1 if cut > 0 else _CONTENT_LIMIT
        chunks.append(text[:cut])
        text = text[cut:]
    return [*chunks, text]


_MASKED_LINK = re.compile(r"\[([^\[\]\n]*)\]\(")


def as_text(text: str) -> str:
    """``text`` with every masked link (``[label](url)``, which Discord renders as a
    clickable "label") escaped to show as written: the cockpit relays the agent's words,
    and posts no links of its own. Other markdown stays; pings are off on every post."""
    return _MASKED_LINK.sub(r"\\[\1](", text)


def _strip_mention(text: str, bot_user: str) -> str:
    """``<@BOT> do it`` -> ``do it``: the mention is how a channel addresses the bot."""
    if not bot_user:
        return text
    return re.sub(rf"^\s*<@!?{re.escape(bot_user)}>[\s:,]*", "", text, count=1)
