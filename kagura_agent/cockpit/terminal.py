"""The terminal transport: the operator at this shell, one line per command.

Every line on stdin is a message from the local user in the single thread "tty"; the
cockpit's answers go to stdout. Approval requests print the two commands that answer
them; a running session prints the one that stops it. A long output (an attachment on a
chat) is printed whole between two rulers, so the terminal shows the same stream. Input is read from the file descriptor (not a Python buffer) with a short select
timeout, so :meth:`stop` from another thread — a signal handler — ends :meth:`run`.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from typing import TextIO

from kagura_agent.cockpit.transport import Event, Handler

THREAD = "tty"
POLL_SECONDS = 0.2
# A command is a line; a chat message is at most some 40 000 characters on Slack. A
# longer line is dropped (with a word to the operator), never buffered whole.
MAX_LINE = 64 * 1024


class TerminalTransport:
    name = "terminal"
    max_chars = 4000  # longer outputs are printed whole, framed as an attachment
    post_interval = 0.0  # a terminal has no rate limit

    def __init__(
        self, user: str, *, stdin: TextIO | None = None, stdout: TextIO | None = None
    ) -> None:
        self.user = user
        self._in = stdin if stdin is not None else sys.stdin
        self._out = stdout if stdout is not None else sys.stdout
        self._stopped = threading.Event()
        self._write_lock = threading.Lock()

    def run(self, handle: Handler) -> None:
        self.say(THREAD, "kagura-agent serve: type `help` for the commands, Ctrl-D to stop")
        fd = self._in.fileno()
        line = bytearray()
        skipping = False  # inside a line already refused as too long
        while not self._stopped.is_set():
            ready, _, _ = select.select([fd], [], [], POLL_SECONDS)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # EOF: the operator is done
                break
            # Each byte is looked at once, and a line is kept only up to MAX_LINE: input
            # with no newline (a pasted file) costs no more than that.
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                if not skipping:
                    line += chunk[start:] if end < 0 else chunk[start:end]
                    if len(line) > MAX_LINE:
                        line.clear()
                        skipping = True
                        self.say(THREAD, f"a line longer than {MAX_LINE // 1024} KiB was ignored")
                if end < 0:
                    break
                if not skipping:
                    text = line.decode(errors="replace").strip()
                    if text:
                        handle(Event(self.name, self.user, THREAD, text=text))
                line.clear()
                skipping = False
                start = end + 1

    def stop(self) -> None:
        self._stopped.set()

    def say(self, thread: str, text: str) -> None:
        with self._write_lock:
            self._out.write(text.rstrip("\n") + "\n")
            self._out.flush()

    def ask(self, thread: str, text: str, request: str) -> None:
        self.say(thread, f"{text}\n  answer: approve {request}  |  deny {request}")

    def offer_stop(self, thread: str, text: str, request: str) -> None:
        self.say(thread, f"{text}\n  stop it: kill {request}")

    def attach(self, thread: str, filename: str, content: str, comment: str) -> None:
        body = content.rstrip("\n")
        self.say(
            thread,
            f"{comment}\n──── {filename} ({len(content)} chars) ────\n{body}\n──── end of {filename} ────",
        )
