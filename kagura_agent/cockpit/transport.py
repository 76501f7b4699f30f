"""The cockpit's one seam to chat: every transport turns its traffic into :class:`Event`
values and offers three ways to answer. The core never imports a chat SDK.

    transport.run(handle)         block, calling handle(event) for each inbound event
    transport.say(thread, text)   post text in a thread
    transport.ask(thread, text, request)
                                  post text with Approve / Deny buttons; a press comes
                                  back as Event(action="approve"|"deny", request=request)
    transport.offer_stop(thread, text, request)
                                  post text with one ❌ Stop button; a press comes back
                                  as Event(action="kill", request=request)
    transport.attach(thread, filename, content, comment)
                                  post ``content`` whole as a file (Slack: a file upload,
                                  Discord: an attachment, the terminal: printed in full)
    transport.stop()              make run() return (from any thread)

Two attributes tell the relay how to batch a run's output for this chat:

    max_chars       the longest message it posts as text (longer output is attached)
    post_interval   seconds between posts in one channel (the chat's rate limit)

``thread`` is opaque to the core: the transport makes it (terminal: "tty"; Slack:
"CHANNEL:THREAD_TS") and gets it back to reply in the same place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

Handler = Callable[["Event"], None]


@dataclass(frozen=True)
class Event:
    """One inbound thing: a message (``text``) or a button press (``action``)."""

    transport: str
    user: str  # the transport's user id; the operator gate compares it
    thread: str
    text: str = ""
    action: str = ""  # "approve" | "deny" | "kill" for a button press
    request: str = ""  # the approval request a button answers


class Transport(Protocol):
    name: str
    max_chars: int
    post_interval: float

    def run(self, handle: Handler) -> None: ...

    def stop(self) -> None: ...

    def say(self, thread: str, text: str) -> None: ...

    def ask(self, thread: str, text: str, request: str) -> None: ...

    def offer_stop(self, thread: str, text: str, request: str) -> None: ...

    def attach(self, thread: str, filename: str, content: str, comment: str) -> None: ...
