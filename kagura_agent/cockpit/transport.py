"""The cockpit's one seam to chat: every transport turns its traffic into :class:`Event`
values and offers three ways to answer. The core never imports a chat SDK.

    transport.run(handle)         block, calling handle(event) for each inbound event
    transport.say(thread, text)   post text in a thread
    transport.ask(thread, text, request)
                                  post text with Approve / Deny buttons; a press comes
                                  back as Event(action="approve"|"deny", request=request)
    transport.stop()              make run() return (from any thread)

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
    action: str = ""  # "approve" | "deny" for a button press
    request: str = ""  # the approval request a button answers


class Transport(Protocol):
    name: str

    def run(self, handle: Handler) -> None: ...

    def stop(self) -> None: ...

    def say(self, thread: str, text: str) -> None: ...

    def ask(self, thread: str, text: str, request: str) -> None: ...
