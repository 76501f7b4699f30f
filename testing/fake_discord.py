"""A fake Discord on 127.0.0.1: the REST API over HTTP and the Gateway over a real WebSocket.

    GET  /api/v10/users/@me                         the bot user
    GET  /api/v10/oauth2/applications/@me           the bot's application (discord.py login)
    GET  /api/v10/gateway/bot                       url = ws://127.0.0.1:PORT/gateway
    POST /api/v10/channels/{id}/messages            a message (recorded in ``posts``); JSON,
                                                    or multipart/form-data with payload_json
                                                    and files[N] (the attachments)
    POST /api/v10/interactions/{id}/{token}/callback
                                                    an interaction's answer (``callbacks``)
    GET  ws://127.0.0.1:PORT/gateway                the Gateway: HELLO, heartbeat ACKs,
                                                    IDENTIFY -> READY, then the dispatches
                                                    a test pushes (zlib-stream when asked)

REST calls need ``Authorization: Bot TOKEN`` (401 otherwise); the interaction callback is
authorised by the interaction's own token in its path, as on Discord. Tests act as people:
``send_message`` dispatches MESSAGE_CREATE, ``press`` an INTERACTION_CREATE for a button.
Tokens are never recorded: IDENTIFY payloads are kept with the token removed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import secrets
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from testing.fake_http import FakeServer, Request
from testing.websocket import BINARY, CLOSE, CONT, PING, PONG, TEXT, WS_GUID, Link, Listener

API = "/api/v10"
CONTENT_LIMIT = 2000  # characters in one message's content; Discord answers 50035 beyond
_EPOCH_MS = 1420070400000  # Discord's snowflake epoch (2015-01-01)
# Gateway opcodes (discord.com/developers/docs/topics/opcodes-and-status-codes)
DISPATCH, HEARTBEAT, IDENTIFY, RESUME, HELLO, HEARTBEAT_ACK = 0, 1, 2, 6, 10, 11
AUTHENTICATION_FAILED, DISALLOWED_INTENTS = 4004, 4014  # Gateway close codes
MESSAGE_CONTENT = 1 << 15  # the privileged intent to read messages' text


@dataclass(frozen=True)
class Post:
    """One POST /channels/{id}/messages, as the bot sent it, and the message it made."""

    channel: str
    payload: dict[str, Any]
    id: str
    files: tuple[tuple[str, bytes], ...] = ()  # attachments: (filename, content)


@dataclass(frozen=True)
class Callback:
    """One interaction callback: which interaction, and the response (type, data)."""

    interaction: str
    payload: dict[str, Any]


class _Gateway:
    """One Gateway connection: JSON text frames, or one zlib stream when asked for."""

    def __init__(self, link: Link, compress: bool) -> None:
        self.link = link
        self.ready = False
        self._zlib = zlib.compressobj() if compress else None
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        with self._lock:  # one stream: compress and send in the same order
            if self._zlib is None:
                self.link.send(TEXT, data)
            else:
                self.link.send(
                    BINARY, self._zlib.compress(data) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
                )


class FakeDiscord(FakeServer):
    """Discord's REST API and Gateway for one bot; a context manager."""

    bot_user_id = "1100000000000000001"  # a bot's application id is its user id
    bot_name = "kagura"

    def __init__(self, token: str = "fake-bot-token", *, timeout: float = 5.0) -> None:
        super().__init__()
        self.token = token
        self.timeout = timeout
        self.grant_message_content = True  # False: as if not enabled in the developer portal
        self.posts: list[Post] = []
        self.callbacks: list[Callback] = []
        self.identified: list[dict[str, Any]] = []  # IDENTIFY payloads, token removed
        self._cond = threading.Condition()
        self._gateways: list[_Gateway] = []
        self._messages: dict[str, dict[str, Any]] = {}
        self._interactions: dict[str, str] = {}  # id -> token, until answered
        self._seq = itertools.count(1)
        self._serial = itertools.count(1)
        self._listener: Listener | None = None
        self.route("GET", API + r"/users/@me", self._me)
        self.route("GET", API + r"/oauth2/applications/@me", self._application)
        self.route("GET", API + r"/gateway(?:/bot)?", self._gateway_url)
        self.route("POST", API + r"/channels/(?P<channel>\d+)/messages", self._post)
        self.route(
            "POST", API + r"/interactions/(?P<id>\d+)/(?P<token>[^/]+)/callback", self._callback
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeDiscord:
        super().start()
        self._listener = Listener(self._serve)
        return self

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._cond:
            gateways, self._gateways = self._gateways, []
        for gateway in gateways:
            gateway.link.close(1001)
        super().stop()

    def __enter__(self) -> FakeDiscord:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """The API root, as ``https://discord.com/api/v10`` is Discord's."""
        return self.url + API

    @property
    def gateway_url(self) -> str:
        assert self._listener is not None, "start() first"
        return f"ws://127.0.0.1:{self._listener.port}/gateway"

    # -- what a person does in Discord -------------------------------------------------

    def send_message(
        self,
        user: str,
        channel: str,
        content: str,
        *,
        guild: str | None = None,
        bot: bool = False,
        reply_to: str | None = None,
    ) -> str:
        """Dispatch MESSAGE_CREATE for a message ``user`` wrote (a reply to the message
        ``reply_to``, as Discord's Reply does); return its id."""
        author = _user(user, f"user{user[-4:]}", bot=bot)
        message = self._message(channel, author, content, guild=guild)
        if reply_to is not None:
            with self._cond:
                referenced = self._messages.get(reply_to)
            message.update(
                type=19,  # REPLY
                message_reference={"type": 0, "message_id": reply_to, "channel_id": channel},
                referenced_message=referenced,
            )
        if guild is not None:
            message["member"] = _member()
        self._push("MESSAGE_CREATE", message)
        return str(message["id"])

    def press(self, user: str, message_id: str, custom_id: str) -> str:
        """Press a button on a message the bot posted; dispatch INTERACTION_CREATE, return its id."""
        with self._cond:
            message = self._messages[message_id]
            interaction_id, token = self._snowflake(), f"aW50ZXJhY3Rpb24{secrets.token_hex(16)}"
            self._interactions[interaction_id] = token
        guild = message.get("guild_id")
        interaction: dict[str, Any] = {
            "id": interaction_id,
            "application_id": self.bot_user_id,
            "type": 3,  # MESSAGE_COMPONENT
            "data": {"custom_id": custom_id, "component_type": 2},  # a button
            "channel_id": message["channel_id"],
            "channel": {"id": message["channel_id"], "type": 0 if guild else 1},
            "token": token,
            "version": 1,
            "message": message,
            "locale": "en-US",
            "app_permissions": "0",
            "entitlements": [],
            "authorizing_integration_owners": {"0" if guild else "1": self.bot_user_id},
            "context": 0 if guild else 1,  # GUILD or BOT_DM
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        person = _user(user, f"user{user[-4:]}")
        if guild:
            channel = {
                "id": message["channel_id"],
                "type": 0,  # GUILD_TEXT, as a partial channel with its permissions
                "guild_id": guild,
                "name": "general",
                "position": 0,
                "flags": 0,
                "parent_id": None,
                "nsfw": False,
                "rate_limit_per_user": 0,
                "topic": None,
                "last_message_id": message_id,
                "permissions": "0",
            }
            interaction.update(
                channel=channel, guild_id=guild, member={**_member(), "user": person}
            )
        else:
            interaction["user"] = person
        self._push("INTERACTION_CREATE", interaction)
        return interaction_id

    # -- waiting, for tests ------------------------------------------------------------

    def wait_for_posts(self, count: int, timeout: float | None = None) -> list[Post]:
        """Block until at least ``count`` messages were posted; return them all."""
        return self._wait(lambda: self.posts, count, "posts", timeout)

    def wait_for_callbacks(self, count: int, timeout: float | None = None) -> list[Callback]:
        """Block until at least ``count`` interactions were answered; return them all."""
        return self._wait(lambda: self.callbacks, count, "callbacks", timeout)

    def wait_for_connection(self, timeout: float | None = None) -> None:
        """Block until a client is identified (READY was sent)."""
        self._ready_gateway(timeout)

    @property
    def connections(self) -> int:
        with self._cond:
            return len(self._gateways)

    def _wait(self, items: Any, count: int, what: str, timeout: float | None) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: len(items()) >= count, timeout or self.timeout):
                raise TimeoutError(f"expected {count} {what}, got {items()}")
            return list(items())

    # -- REST --------------------------------------------------------------------------

    def _authorised(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme == "Bot" and secrets.compare_digest(token.encode(), self.token.encode())

    def _guarded(self, request: Request, name: str) -> tuple[int, Any] | None:
        self.record("api", route=name)
        if not self._authorised(request):
            return 401, {"message": "401: Unauthorized", "code": 0}
        return None

    def _me(self, request: Request) -> tuple[int, Any]:
        return self._guarded(request, "users/@me") or (200, self._bot())

    def _application(self, request: Request) -> tuple[int, Any]:
        return self._guarded(request, "oauth2/applications/@me") or (
            200,
            {
                "id": self.bot_user_id,
                "name": self.bot_name,
                "description": "",
                "icon": None,
                "bot_public": False,
                "bot_require_code_grant": False,
                "owner": _user("1000000000000000001", "owner"),
                "verify_key": "0" * 64,
                "flags": 1 << 19,  # GATEWAY_MESSAGE_CONTENT_LIMITED: the intent is granted
                "bot": self._bot(),
            },
        )

    def _gateway_url(self, request: Request) -> tuple[int, Any]:
        refused = self._guarded(request, "gateway/bot")
        if refused:
            return refused
        limit = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
        return 200, {"url": self.gateway_url, "shards": 1, "session_start_limit": limit}

    def _post(self, request: Request) -> tuple[int, Any]:
        refused = self._guarded(request, "channels/messages")
        if refused:
            return refused
        try:
            payload, files = _message_body(request)
        except ValueError as exc:
            return 400, {"message": f"Invalid Form Body: {exc}", "code": 50035}
        content = str(payload.get("content") or "")
        if len(content) > CONTENT_LIMIT:
            errors = {"content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH"}]}}
            return 400, {"message": "Invalid Form Body", "code": 50035, "errors": errors}
        if not (content or payload.get("components") or payload.get("embeds") or files):
            return 400, {"message": "Cannot send an empty message", "code": 50006}
        channel = request.match["channel"]
        with self._cond:
            known = dict(self._messages)
        message = self._message(channel, self._bot(), content, guild=None)
        message["components"] = [_with_ids(row) for row in payload.get("components") or []]
        message["attachments"] = [
            {
                "id": self._snowflake(),
                "filename": name,
                "size": len(data),
                "url": f"{self.url}/attachments/{channel}/{name}",
                "proxy_url": f"{self.url}/attachments/{channel}/{name}",
            }
            for name, data in files
        ]
        reference = payload.get("message_reference")
        if reference:
            referenced = known.get(str(reference.get("message_id")))
            if referenced is None and reference.get("fail_if_not_exists", True):
                return 400, {"message": "Invalid Form Body", "code": 50035}
            message["message_reference"] = {"type": 0, "channel_id": channel, **reference}
            message["referenced_message"] = referenced
            message["guild_id"] = (referenced or {}).get("guild_id")
        with self._cond:
            self._messages[str(message["id"])] = message
            self.posts.append(Post(channel, payload, str(message["id"]), tuple(files)))
            self._cond.notify_all()
        return 200, message

    def _callback(self, request: Request) -> tuple[int, Any]:
        interaction, token = request.match["id"], request.match["token"]
        self.record("api", route="interactions/callback")
        with self._cond:
            expected = self._interactions.get(interaction)
            if expected is None or not secrets.compare_digest(expected, token):
                return 404, {"message": "Unknown interaction", "code": 10062}
            del self._interactions[interaction]  # one answer per interaction
            self.callbacks.append(Callback(interaction, request.json()))
            self._cond.notify_all()
        if request.query.get("with_response", ["false"])[-1].lower() not in ("1", "true"):
            return 204, None
        return 200, {"interaction": {"id": interaction, "type": 3}}

    # -- the Gateway -------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        gateway: _Gateway | None = None
        try:
            gateway = _handshake(sock)
            if gateway is None:
                return
            with self._cond:
                self._gateways.append(gateway)
            gateway.send({"op": HELLO, "d": {"heartbeat_interval": 41250}, "s": None, "t": None})
            self._read_loop(gateway)
        except OSError:
            pass  # the client went away (ConnectionError is an OSError)
        finally:
            with self._cond:
                if gateway in self._gateways:
                    self._gateways.remove(gateway)
                self._cond.notify_all()
            sock.close()

    def _read_loop(self, gateway: _Gateway) -> None:
        link, message = gateway.link, b""
        while True:
            fin, opcode, payload = link.read_frame()
            if opcode == PING:
                link.send(PONG, payload)
            elif opcode == CLOSE:
                link.close(struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1000)
                return
            elif opcode in (TEXT, BINARY, CONT):
                message = payload if opcode != CONT else message + payload
                if fin:
                    self._on_frame(gateway, json.loads(message))

    def _on_frame(self, gateway: _Gateway, frame: dict[str, Any]) -> None:
        op, data = frame.get("op"), frame.get("d")
        if op == HEARTBEAT:
            gateway.send({"op": HEARTBEAT_ACK, "d": None, "s": None, "t": None})
        elif op == IDENTIFY and isinstance(data, dict):
            token = str(data.pop("token", ""))
            with self._cond:
                self.identified.append(data)
            if not secrets.compare_digest(token.encode(), self.token.encode()):
                gateway.link.close(AUTHENTICATION_FAILED)
                return
            if int(data.get("intents", 0)) & MESSAGE_CONTENT and not self.grant_message_content:
                gateway.link.close(DISALLOWED_INTENTS)
                return
            ready = {
                "v": 10,
                "user": self._bot(),
                "guilds": [],
                "session_id": secrets.token_hex(16),
                "resume_gateway_url": self.gateway_url,
                "application": {"id": self.bot_user_id, "flags": 1 << 19},
                "private_channels": [],
                "relationships": [],
            }
            self._send_dispatch(gateway, "READY", ready)
            with self._cond:
                gateway.ready = True
                self._cond.notify_all()
        elif op == RESUME:
            gateway.link.close(4009)  # session timed out: the client identifies anew

    def _push(self, event: str, data: dict[str, Any]) -> None:
        self._send_dispatch(self._ready_gateway(None), event, data)

    def _send_dispatch(self, gateway: _Gateway, event: str, data: dict[str, Any]) -> None:
        gateway.send({"op": DISPATCH, "d": data, "s": next(self._seq), "t": event})

    def _ready_gateway(self, timeout: float | None) -> _Gateway:
        with self._cond:
            if not self._cond.wait_for(
                lambda: any(g.ready for g in self._gateways), timeout or self.timeout
            ):
                raise TimeoutError("no Gateway client is identified")
            return next(g for g in reversed(self._gateways) if g.ready)

    # -- objects -----------------------------------------------------------------------

    def _bot(self) -> dict[str, Any]:
        return _user(self.bot_user_id, self.bot_name, bot=True)

    def _message(
        self, channel: str, author: dict[str, Any], content: str, *, guild: str | None
    ) -> dict[str, Any]:
        mentioned = [self._bot()] if f"<@{self.bot_user_id}>" in content else []
        message: dict[str, Any] = {
            "id": self._snowflake(),
            "type": 0,
            "channel_id": channel,
            "author": author,
            "content": content,
            "timestamp": datetime.now(UTC).isoformat(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentioned,
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "components": [],
            "pinned": False,
            "flags": 0,
        }
        if guild is not None:
            message["guild_id"] = guild
        with self._cond:
            self._messages[str(message["id"])] = message
        return message

    def _snowflake(self) -> str:
        return str(((int(time.time() * 1000) - _EPOCH_MS) << 22) | (next(self._serial) & 0xFFF))


def _handshake(sock: socket.socket) -> _Gateway | None:
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(4096)
        if not chunk or len(raw) > 65536:
            return None
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    verb, target, *_ = [*request_line.split(" "), "", ""]
    parts = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    key = headers.get("sec-websocket-key", "")
    if (
        verb != "GET"
        or parts.path.rstrip("/") != "/gateway"
        or query.get("encoding", "json") != "json"
        or headers.get("upgrade", "").lower() != "websocket"
        or headers.get("sec-websocket-version") != "13"
        or not key
    ):
        with contextlib.suppress(OSError):
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        return None
    accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
    sock.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n"
    )
    # zlib-stream is the transport compression discord.py asks for; anything else (such as
    # zstd-stream) is answered uncompressed, which a client must read as plain JSON text.
    return _Gateway(Link(sock, rest), compress=query.get("compress") == "zlib-stream")


def _message_body(request: Request) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """A message's JSON payload and its attachments: a JSON body, or multipart/form-data
    with ``payload_json`` and one ``files[N]`` part per attachment, as Discord takes."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        return request.json(), []
    from email.parser import BytesParser
    from email.policy import HTTP

    head = f"Content-Type: {kind}\r\n\r\n".encode()
    form = BytesParser(policy=HTTP).parsebytes(head + request.body)
    if not form.is_multipart():
        raise ValueError("not a multipart body")
    payload: dict[str, Any] = {}
    files: list[tuple[str, bytes]] = []
    for part in form.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if name == "payload_json":
            payload = json.loads(data)
        elif isinstance(name, str) and name.startswith("files["):
            files.append((str(part.get_filename() or name), bytes(data)))
    return payload, files


def _user(user_id: str, name: str, *, bot: bool = False) -> dict[str, Any]:
    user: dict[str, Any] = {
        "id": user_id,
        "username": name,
        "discriminator": "0",
        "global_name": name,
        "avatar": None,
        "public_flags": 0,
    }
    return {**user, "bot": True} if bot else user


def _member() -> dict[str, Any]:
    return {
        "roles": [],
        "joined_at": "2024-01-01T00:00:00+00:00",
        "deaf": False,
        "mute": False,
        "flags": 0,
        "permissions": "0",
    }


def _with_ids(row: dict[str, Any]) -> dict[str, Any]:
    """An action row as Discord stores it (every component gets an id)."""
    components = [{**c, "id": i} for i, c in enumerate(row.get("components") or [], 2)]
    return {**row, "id": 1, "components": components}
