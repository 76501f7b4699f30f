"""A fake Slack on 127.0.0.1: the Web API over HTTP and Socket Mode over a real WebSocket.

    POST /api/auth.test              bot token  -> ok, user_id, bot_id, team_id
    POST /api/apps.connections.open  app token  -> ok, url = ws://127.0.0.1:PORT/link?ticket=..
    POST /api/chat.postMessage       bot token  -> ok, channel, ts   (recorded in ``posts``)
    POST /api/chat.update            bot token  -> ok, channel, ts   (recorded in ``posts``)
    POST /api/files.getUploadURLExternal   bot token, filename, length -> upload_url, file_id
    POST /upload/FILE_ID             the file's bytes (no token: the URL is the credential)
    POST /api/files.completeUploadExternal bot token, files=[{id,title}], channel_id,
                                     thread_ts, initial_comment -> the file shared there
                                     (recorded in ``uploads``)
    GET  ws://127.0.0.1:PORT/link    Socket Mode (RFC 6455): "hello", then the envelopes a
                                     test pushes; the client acks each with its envelope_id

A token is read from the Authorization header or a ``token`` field, as Slack does; a wrong
one is ``invalid_auth``. Tests act as people in Slack: ``send_message`` and ``send_mention``
deliver an events_api envelope, ``press`` an interactive block_actions one, and each returns
the client's ack, so when it returns the app has taken the envelope. Tokens are never
recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from testing.fake_http import FakeServer, Request
from testing.websocket import (
    BINARY,
    CLOSE,
    CONT,
    PING,
    PONG,
    TEXT,
    WS_GUID,
    Link,
    Listener,
    ProtocolError,
)

_BOT_METHODS = (
    "auth.test",
    "chat.postMessage",
    "chat.update",
    "files.getUploadURLExternal",
    "files.completeUploadExternal",
)


@dataclass(frozen=True)
class Post:
    """One chat.postMessage or chat.update call, as the app sent it (token removed)."""

    method: str
    payload: dict[str, Any]
    ts: str


@dataclass(frozen=True)
class Upload:
    """One file shared by files.completeUploadExternal: where, and what it held."""

    channel: str
    thread_ts: str | None
    filename: str
    title: str
    content: bytes
    initial_comment: str


class FakeSlack(FakeServer):
    """Slack's Web API and Socket Mode for one workspace with one bot; a context manager."""

    team_id = "T0KAGURA"
    app_id = "A0KAGURA"
    bot_id = "B0KAGURA"
    bot_user_id = "U0KAGURABOT"

    def __init__(
        self, bot_token: str = "xoxb-fake", app_token: str = "xapp-fake", *, timeout: float = 5.0
    ) -> None:
        super().__init__()
        self.bot_token = bot_token
        self.app_token = app_token
        self.timeout = timeout
        self.refuse_websockets = False  # answer the WebSocket handshake with 403
        self.missing_scopes: set[str] = set()  # methods answered missing_scope (no files:write)
        self.posts: list[Post] = []
        self.uploads: list[Upload] = []
        self._pending_files: dict[str, dict[str, Any]] = {}  # file id -> name, length, data
        self.received: list[dict[str, Any]] = []  # every JSON frame the client sent
        self._cond = threading.Condition()
        self._links: list[Link] = []
        self._tickets: set[str] = set()
        self._acks: dict[str, dict[str, Any]] = {}
        self._messages: dict[tuple[str, str], dict[str, Any]] = {}
        self._clock = int(time.time())
        self._serial = 0
        self._listener: Listener | None = None
        self.route("POST", r"/api/(?P<method>[\w.]+)", self._api)
        self.route("POST", r"/upload/(?P<file>F\w+)", self._upload)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeSlack:
        super().start()
        self._listener = Listener(self._serve)
        return self

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._cond:
            links, self._links = self._links, []
        for link in links:
            link.close(1001)  # going away
        super().stop()

    def __enter__(self) -> FakeSlack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"{self.url}/api/"

    # -- what a person does in Slack ---------------------------------------------------

    def send_message(
        self,
        user: str,
        channel: str,
        text: str,
        thread_ts: str | None = None,
        *,
        ts: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Deliver a ``message`` event (``extra`` adds fields such as bot_id or subtype)."""
        event = self._event("message", user, channel, text, thread_ts, ts)
        event.update(channel_type=_channel_type(channel), client_msg_id=str(uuid.uuid4()))
        return self.send_event({**event, **extra})

    def send_mention(
        self,
        user: str,
        channel: str,
        text: str,
        thread_ts: str | None = None,
        *,
        ts: str | None = None,
    ) -> dict[str, Any]:
        """Deliver an ``app_mention`` event, as Slack does beside the message that mentions the bot."""
        return self.send_event(self._event("app_mention", user, channel, text, thread_ts, ts))

    def send_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """Deliver any Events API event in an events_api envelope; return the client's ack."""
        payload = {
            "token": "fake-verification-token",
            "team_id": self.team_id,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{secrets.token_hex(5).upper()}",
            "event_time": int(time.time()),
            "authorizations": [
                {"team_id": self.team_id, "user_id": self.bot_user_id, "is_bot": True}
            ],
            "is_ext_shared_channel": False,
        }
        return self._deliver("events_api", payload, retry_attempt=0, retry_reason="")

    def press(
        self,
        user: str,
        channel: str,
        message_ts: str,
        action_id: str,
        value: str,
        *,
        team: str | None = None,
    ) -> dict[str, Any]:
        """Press a button on a message; deliver the block_actions payload, return the ack.
        ``team``: the presser's workspace when not this one (a Slack Connect channel)."""
        with self._cond:
            message = self._messages.get(
                (channel, message_ts), {"type": "message", "ts": message_ts}
            )
        container = {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel,
            "is_ephemeral": False,
        }
        if "thread_ts" in message:
            container["thread_ts"] = message["thread_ts"]
        payload = {
            "type": "block_actions",
            "user": {"id": user, "name": user.lower(), "team_id": team or self.team_id},
            "api_app_id": self.app_id,
            "token": "fake-verification-token",
            "container": container,
            "trigger_id": f"{self._next_ts()}.{secrets.token_hex(8)}",
            "team": {"id": self.team_id, "domain": "kagura-test"},
            "channel": {"id": channel, "name": "directmessage"},
            "message": message,
            "response_url": f"{self.url}/actions/{secrets.token_hex(8)}",  # never leaves 127.0.0.1
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": "kagura",
                    "value": value,
                    "type": "button",
                    "action_ts": self._next_ts(),
                }
            ],
            "state": {"values": {}},
        }
        return self._deliver("interactive", payload)

    def refresh(self) -> None:
        """Rotate the connection as Slack does now and then: send ``disconnect``, wait for
        the client's new connection, then close the old one."""
        old = self._open_link(None)
        old.send_json({"type": "disconnect", "reason": "refresh_requested", "debug_info": {}})
        with self._cond:
            if not self._cond.wait_for(
                lambda: any(k is not old for k in self._links), self.timeout
            ):
                raise TimeoutError("the client did not reconnect after a disconnect")
            self._links.remove(old)
        old.close(1001)

    # -- waiting, for tests ------------------------------------------------------------

    def wait_for_posts(self, count: int, timeout: float | None = None) -> list[Post]:
        """Block until at least ``count`` posts were made; return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.posts) >= count, timeout or self.timeout):
                raise TimeoutError(f"expected {count} posts, got {len(self.posts)}: {self.posts}")
            return list(self.posts)

    def wait_for_uploads(self, count: int, timeout: float | None = None) -> list[Upload]:
        """Block until at least ``count`` files were shared; return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.uploads) >= count, timeout or self.timeout):
                raise TimeoutError(f"expected {count} uploads, got {self.uploads}")
            return list(self.uploads)

    def wait_for_connection(self, timeout: float | None = None) -> None:
        """Block until a Socket Mode client is connected."""
        self._open_link(timeout)

    @property
    def connections(self) -> int:
        with self._cond:
            return len(self._links)

    # -- the Web API -------------------------------------------------------------------

    def _api(self, request: Request) -> tuple[int, Any]:
        method = request.match["method"]
        params = _params(request)
        body_token = params.pop("token", None)  # slack_sdk sends it in both places at times
        token = request.bearer() or body_token
        self.record("api", method=method)
        if method not in (*_BOT_METHODS, "apps.connections.open"):
            return 200, {"ok": False, "error": "unknown_method"}
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token is None:
            return 200, {"ok": False, "error": "not_authed"}
        if not secrets.compare_digest(token, expected):
            return 200, {"ok": False, "error": "invalid_auth"}
        if method in self.missing_scopes:
            return 200, {"ok": False, "error": "missing_scope", "needed": "files:write"}
        if method == "auth.test":
            return 200, {
                "ok": True,
                "url": f"{self.url}/",
                "team": "kagura-test",
                "user": "kagura",
                "team_id": self.team_id,
                "user_id": self.bot_user_id,
                "bot_id": self.bot_id,
                "is_enterprise_install": False,
            }
        if method == "apps.connections.open":
            assert self._listener is not None, "start() first"
            port, ticket = self._listener.port, secrets.token_hex(8)
            with self._cond:
                self._tickets.add(ticket)
            return 200, {"ok": True, "url": f"ws://127.0.0.1:{port}/link?ticket={ticket}"}
        if method == "files.getUploadURLExternal":
            return 200, self._upload_url(params)
        if method == "files.completeUploadExternal":
            return 200, self._complete_upload(params)
        return 200, self._post(method, params)

    def _upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        filename, length = params.get("filename"), str(params.get("length", ""))
        if not filename or not length.isdigit():
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{secrets.token_hex(5).upper()}"
        with self._cond:
            self._pending_files[file_id] = {"name": filename, "length": int(length), "data": None}
        return {"ok": True, "upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}

    def _upload(self, request: Request) -> tuple[int, Any]:
        file_id = request.match["file"]
        self.record("upload", file=file_id)
        with self._cond:
            pending = self._pending_files.get(file_id)
            if pending is None or pending["data"] is not None:
                return 404, {"ok": False, "error": "file_not_found"}
            if len(request.body) != pending["length"]:
                return 400, {"ok": False, "error": "length_mismatch"}
            pending["data"] = request.body
        return 200, {"ok": True}

    def _complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        files = params.get("files")
        if isinstance(files, str):
            files = json.loads(files)
        channel = params.get("channel_id")
        if not isinstance(files, list) or not files or not channel:
            return {"ok": False, "error": "invalid_arguments"}
        shared = []
        with self._cond:
            for item in files:
                pending = self._pending_files.pop(str(item.get("id")), None)
                if pending is None or pending["data"] is None:
                    return {"ok": False, "error": "file_not_found"}
                upload = Upload(
                    channel=str(channel),
                    thread_ts=params.get("thread_ts") or None,
                    filename=pending["name"],
                    title=str(item.get("title") or pending["name"]),
                    content=pending["data"],
                    initial_comment=str(params.get("initial_comment") or ""),
                )
                self.uploads.append(upload)
                shared.append(
                    {"id": item.get("id"), "name": upload.filename, "title": upload.title}
                )
            self._cond.notify_all()
        return {"ok": True, "files": shared}

    def _post(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        channel = params.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not (params.get("text") or params.get("blocks")):
            return {"ok": False, "error": "no_text"}
        with self._cond:
            if method == "chat.update":
                ts = str(params.get("ts", ""))
                if (channel, ts) not in self._messages:
                    return {"ok": False, "error": "message_not_found"}
            else:
                ts = self._next_ts()
            message = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id}
            message.update(
                {k: v for k, v in params.items() if k in ("text", "blocks", "thread_ts")}
            )
            self._messages[(channel, ts)] = {**message, "ts": ts}
            self.posts.append(Post(method, params, ts))
            self._cond.notify_all()
        return {"ok": True, "channel": channel, "ts": ts, "message": {**message, "ts": ts}}

    # -- Socket Mode -------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        link: Link | None = None
        try:
            link = self._handshake(sock)
            if link is None:
                return
            link.send_json(
                {
                    "type": "hello",
                    "num_connections": self.connections,
                    "debug_info": {"host": "fake-slack", "approximate_connection_time": 3600},
                    "connection_info": {"app_id": self.app_id},
                }
            )
            self._read_loop(link)
        except ProtocolError:
            if link is not None:
                link.close(1002)
        except OSError:
            pass  # the client went away (ConnectionError is an OSError)
        finally:
            with self._cond:
                if link in self._links:
                    self._links.remove(link)
            sock.close()  # a second close, after link.close(), is harmless

    def _handshake(self, sock: socket.socket) -> Link | None:
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
        ticket = parse_qs(parts.query).get("ticket", [""])[0]
        with self._cond:
            ticket_ok = ticket in self._tickets
            self._tickets.discard(ticket)  # a ticket is good for one connection
        key = headers.get("sec-websocket-key", "")
        if self.refuse_websockets:
            status = "403 Forbidden"
        elif not ticket_ok:
            status = "401 Unauthorized"
        elif (
            verb != "GET"
            or parts.path.rstrip("/") != "/link"
            or headers.get("upgrade", "").lower() != "websocket"
            or "upgrade" not in headers.get("connection", "").lower()
            or headers.get("sec-websocket-version") != "13"
            or not key
        ):
            status = "400 Bad Request"
        else:
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            sock.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n"
            )
            link = Link(sock, rest)
            with self._cond:
                self._links.append(link)
                self._cond.notify_all()
            return link
        sock.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())
        return None

    def _read_loop(self, link: Link) -> None:
        opcode, message = TEXT, b""
        while True:
            fin, frame_opcode, payload = link.read_frame()
            if frame_opcode == PING:
                link.send(PONG, payload)
            elif frame_opcode == CLOSE:
                link.close(struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1000)
                return
            elif frame_opcode in (TEXT, BINARY):
                opcode, message = frame_opcode, payload
            elif frame_opcode == CONT:
                message += payload
            if fin and frame_opcode in (TEXT, BINARY, CONT) and opcode == TEXT:
                self._on_text(message.decode())

    def _on_text(self, text: str) -> None:
        message = json.loads(text)
        with self._cond:
            self.received.append(message)
            if isinstance(message, dict) and "envelope_id" in message:
                self._acks[str(message["envelope_id"])] = message
            self._cond.notify_all()

    def _deliver(self, kind: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
        envelope_id = str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": kind,
            "accepts_response_payload": False,
            **extra,
        }
        self._open_link(None).send_json(envelope)
        with self._cond:
            if not self._cond.wait_for(lambda: envelope_id in self._acks, self.timeout):
                raise TimeoutError(f"the client did not ack the {kind} envelope in {self.timeout}s")
            return self._acks.pop(envelope_id)

    def _open_link(self, timeout: float | None) -> Link:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._links), timeout or self.timeout):
                raise TimeoutError("no Socket Mode client is connected")
            return self._links[-1]

    def _event(
        self, kind: str, user: str, channel: str, text: str, thread_ts: str | None, ts: str | None
    ) -> dict[str, Any]:
        ts = ts or self._next_ts()
        event = {"type": kind, "user": user, "text": text, "ts": ts, "channel": channel}
        event.update(event_ts=ts, team=self.team_id)
        return {**event, "thread_ts": thread_ts} if thread_ts else event

    def _next_ts(self) -> str:
        with self._cond:
            self._serial += 1
            return f"{self._clock + self._serial}.{self._serial:06d}"


def _params(request: Request) -> dict[str, Any]:
    """The call's arguments from a JSON or form body (and the query string)."""
    params: dict[str, Any] = {k: v[-1] for k, v in request.query.items()}
    if request.headers.get("content-type", "").startswith("application/json"):
        params.update(request.json())
    elif request.body:
        form = parse_qs(request.body.decode(), keep_blank_values=True)
        params.update({k: v[-1] for k, v in form.items()})
        if isinstance(params.get("blocks"), str):
            params["blocks"] = json.loads(params["blocks"])  # form bodies carry blocks as JSON
    return params


def _channel_type(channel: str) -> str:
    return {"D": "im", "G": "group", "C": "channel"}.get(channel[:1], "channel")
