"""The live view of a run: phases, tool calls as they happen, text in readable chunks.

Text from the brain is buffered and shown a paragraph at a time (never token by token);
tool calls and results are shown as they happen, with long output cut to a few lines.
Everything shown passes the run's redactor first. ``--json`` turns each item into one
JSON line instead.

Two kinds of line, never confused: kagura-agent's own (a phase, a note, a verify
result: each one line, whatever it quotes neutralised so no line break survives) and the
agent's (what the brain said, its tools' output, the output of verify commands, which run
what the agent wrote): every one of those begins with ``hygiene.AGENT_MARK`` (``┃``), with
colour or without, so the agent printing "✓ verify 'make test' exited 0" shows as
"┃ ✓ verify 'make test' exited 0". Under ``--json`` the agent's text is only ever in a
``brain`` or ``verify_output`` event, never in a ``note`` or a ``phase``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from kagura_agent.apply.records.progress import (
    Note,
    Phase,
    ProgressEvent,
    Severity,
    VerifyExited,
    from_json,
    terminal_line,
    to_json,
)
from kagura_agent.brain.events import (
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    EventShapeError,
    TextEvent,
    ToolCallEvent,
    ToolOutputEvent,
    ToolResultEvent,
    event_from_json,
    event_to_json,
)
from kagura_agent.hygiene import AGENT_MARK, agent_lines, json_text, neutralise
from kagura_agent.membrane.egress.audit import NOT_FORWARDED
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.ui import Style

RESULT_LINES = 6
# Running tools whose streamed lines are counted at once (their results come in order).
MAX_STREAMED_CALLS = 64
VERIFY_LINES = 5  # of a failed verify command's output


def tool_call_detail(tool_input: Any) -> str:
    """What a tool call runs, in one line: the script of ``bash -c``, an argv, a command or
    description, else the input as JSON."""
    if not isinstance(tool_input, dict):
        return json.dumps(tool_input, ensure_ascii=False)
    argv = tool_input.get("argv")
    if isinstance(argv, list) and argv:
        return str(argv[-1]) if argv[:2] == ["bash", "-c"] else " ".join(map(str, argv))
    detail = tool_input.get("command") or tool_input.get("description")
    return str(detail) if detail else json.dumps(tool_input, ensure_ascii=False)


def egress_line(event: dict[str, Any]) -> str:
    """One proxy decision worth showing, in words ("" for an allow). A request to a host
    the allowlist lets through that reached no upstream (the name did not resolve, the
    connection was refused) was allowed: it is not shown as denied."""
    if event.get("decision") != "deny":
        return ""
    where = f"{event.get('host')}:{event.get('port')}"
    reason = str(event.get("reason") or "")
    if reason == NOT_FORWARDED:
        if event.get("entry"):
            return (
                f"⊘ egress to {where} allowed ({event['entry']}), but no upstream answered"
                " (the name did not resolve or the connection failed)"
            )
        return f"⊘ egress to {where} not forwarded (the proxy answered it itself)"
    return f"⊘ egress denied {where}" + (f" ({reason})" if reason else "")


# The severity a colour stood for, on LiveView.note's compatibility path.
_LEGACY = {
    "dim": Severity.QUIET,
    "green": Severity.GOOD,
    "yellow": Severity.WARNING,
    "red": Severity.PROBLEM,
}


class LiveView:
    """The run's view (progress.Progress: steps emit their events here), on a terminal
    or as ``--json`` lines; each item kept in the run's journal too (``keep``)."""

    def __init__(
        self, redactor: Redactor, *, stream: TextIO | None = None, as_json: bool = False
    ) -> None:
        self.out = stream or sys.stderr
        self.style = Style.for_stream(self.out)
        self.redactor = redactor
        self.as_json = as_json
        self.started = time.monotonic()
        self._text = ""
        self._gone = False
        # The run's last brain events (scrubbed), for an incident record.
        self.recent: deque[dict[str, Any]] = deque(maxlen=100)
        # Called with every brain event's JSON (the canary tripwire scans the output).
        self.watchers: list[Callable[[dict[str, Any]], None]] = []
        # Where every item shown is kept too, scrubbed (the run's journal, journal.py).
        self.keep: Callable[[str, dict[str, Any]], None] | None = None
        # Lines of each running tool's output already shown (tool_output events): its
        # result then says how many, without showing them again.
        self._streamed: dict[str, int] = {}
        self._at: float | None = None  # replay: the shown item's own time

    def _kept(self, kind: str, payload: dict[str, Any]) -> None:
        if self.keep is not None:
            self.keep(kind, self.redactor.scrub_data(payload))

    def _write(self, line: str, *styles: str) -> None:
        """One line of our own: secrets scrubbed, control characters and line breaks in
        what it quotes made visible (so it stays one line), then styled (the styling's own
        escapes are the only ones that reach the screen)."""
        self._emit(self.style(neutralise(self.redactor.scrub(line), newlines=False), *styles))

    def _agent(self, text: str, *styles: str) -> None:
        """Text the agent wrote: each of its lines framed (hygiene.agent_lines), the frame
        styled apart from the text."""
        for line in agent_lines(self.redactor.scrub(text)):
            body = line.removeprefix(AGENT_MARK)
            self._emit(self.style(AGENT_MARK, "magenta") + self.style(body, *styles))

    def _emit(self, line: str) -> None:
        if self._gone:
            return
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):
            # Nobody reads any more (a pipe's reader died, e.g. a restarted cockpit): the
            # run goes on to its end and records its outcome; there is just no one to tell.
            self._gone = True

    def _json(self, kind: str, payload: dict[str, Any]) -> None:
        if self._gone:
            return
        try:
            # No raw U+2028, NEL, CSI…: a reader splitting lines the Unicode way would cut
            # the event there, a terminal act on it, and the agent chooses the text.
            line = json_text(json.dumps({"kind": kind, **payload}, ensure_ascii=False, default=str))
            self.out.write(self.redactor.scrub(line) + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):
            self._gone = True

    def _elapsed(self) -> str:
        at = self._at if self._at is not None else time.monotonic() - self.started
        return f"{at:6.1f}s"

    def replay(self, item: dict[str, Any], at: float | None = None) -> bool:
        """Show one item of another apply's ``--json`` stream (``queue follow``) as this
        view shows its own, ``at`` seconds into that run; False for a kind it does not
        show (the caller's own, such as a queue's status)."""
        self._at = at
        try:
            kind = item.get("kind")
            progress = from_json(item)
            if progress is not None:  # a phase or a note, shown as its type says
                self.emit(progress)
            elif kind == "egress":
                self.egress(item)
            elif kind == "incident":
                self.incident(str(item.get("id", "")), str(item.get("reason", "")))
            elif kind == "ask" and "request" in item:
                self.ask(item)
            elif kind == "verify_output":
                self._agent("\n".join(map(str, item.get("lines") or [])), "dim")
            elif kind == "brain":
                try:
                    event = event_from_json(
                        {k: v for k, v in item.items() if k not in ("kind", "at")}
                    )
                except EventShapeError:
                    return False
                self.brain(event)
            else:
                return False
            return True
        finally:
            self._at = None

    def emit(self, event: ProgressEvent) -> None:
        """Show one event of the run's progress (records/progress.py), and keep it."""
        payload = to_json(event)
        del payload["kind"]
        self._kept(event.kind, payload)
        self._show(event, payload)

    def _show(self, event: ProgressEvent, payload: dict[str, Any] | None = None) -> None:
        if self.as_json:
            if payload is None:
                payload = to_json(event)
                del payload["kind"]
            self._json(event.kind, payload)
        else:
            line, styles = terminal_line(event, self._elapsed())
            self._write(line, *styles)

    def phase(self, message: str) -> None:
        """A step reached, in words only: the compatibility path of a step that emits no
        typed event yet (emit one of records/progress.py instead)."""
        self.emit(Phase(message))

    def note(self, message: str, *styles: str) -> None:
        """A note in words only, its severity read back from a colour: the compatibility
        path of a step that emits no typed event yet (emit one instead)."""
        self.emit(Note(message, _LEGACY.get(styles[0] if styles else "", Severity.INFO)))

    def egress(self, event: dict[str, Any]) -> None:
        if self.as_json:
            self._json("egress", event)
            return
        line = egress_line(event)
        if line:
            self._write(f"{self._elapsed()} {line}", "yellow")

    def incident(self, incident_id: str, reason: str) -> None:
        """A tripwire stopped the run (the cockpit relays this to the run's thread)."""
        self._kept("incident", {"id": incident_id, "reason": reason})
        if self.as_json:
            self._json("incident", {"id": incident_id, "reason": reason})
        else:
            self._write(
                f"{self._elapsed()} ⚠ incident {incident_id}: {reason} (kagura-agent incidents)",
                "red",
            )

    def ask(self, question: dict[str, Any]) -> None:
        """A mid-run question for an operator (the cockpit posts it with Approve / Deny;
        on a terminal the prompt that follows asks it)."""
        self._kept("ask", question)
        if self.as_json:
            self._json("ask", question)
        else:
            self._write(f"{self._elapsed()} ? {question['request']}: approval needed", "yellow")

    def brain(self, event: BrainEvent) -> None:
        raw = event_to_json(event)
        for watch in self.watchers:  # the canary tripwire looks for the (redacted) canary
            watch(raw)
        # Kept for an incident record, which is stored and shown later: scrubbed here, the
        # only place that knows the run's secrets.
        scrubbed = self.redactor.scrub_data(raw)
        self.recent.append(scrubbed)
        if self.keep is not None:
            self.keep("brain", scrubbed)
        if self.as_json:
            self._json("brain", raw)
            return
        if isinstance(event, TextEvent):
            self._text += event.text
            while "\n\n" in self._text:
                paragraph, self._text = self._text.split("\n\n", 1)
                self._paragraph(paragraph)
            return
        if isinstance(event, ToolOutputEvent):
            # A running tool's output, as it comes: the agent's text, framed.
            self.flush_text()
            lines = event.text.rstrip("\n").split("\n")
            if len(self._streamed) < MAX_STREAMED_CALLS or event.id in self._streamed:
                self._streamed[event.id] = self._streamed.get(event.id, 0) + len(lines)
            self._agent("\n".join(line[:200] for line in lines), "dim")
            return
        self.flush_text()
        if isinstance(event, ToolCallEvent):
            self._write(f"{self._elapsed()} ▸ {event.name}: {tool_call_detail(event.input)[:200]}")
        elif isinstance(event, ToolResultEvent):
            self._result(event)
        elif isinstance(event, CostEvent):
            usd = f"${event.usd:.4f}" if event.usd is not None else "cost unknown"
            tokens = (event.input_tokens or 0) + (event.output_tokens or 0)
            retried = f", {event.retries} retries" if event.retries else ""
            self._write(
                f"{self._elapsed()} $ {usd}, {event.turns or 0} turns, {tokens:,} tokens{retried}",
                "dim",
            )
        elif isinstance(event, CheckpointEvent):
            where = f"step {event.step} done, {event.pending} pending"
            if not (event.step or event.pending) and event.session_id:
                where = f"brain session {event.session_id}"  # an engine without steps
            self._write(f"{self._elapsed()} ✓ checkpoint: {where}", "dim")
        elif isinstance(event, DoneEvent):
            if event.result:
                self._paragraph(event.result)
            self._write(f"{self._elapsed()} ● brain finished")
        elif isinstance(event, ErrorEvent):
            self._write(f"{self._elapsed()} ✗ brain error ({event.code}): {event.message}", "red")

    def verify(self, results: list[tuple[str, int, str]]) -> None:
        """Each verify command's exit code; the tail of the output of those that failed
        (the agent's: verify runs what it left in the tree)."""
        tails = [
            output.rstrip().splitlines()[-VERIFY_LINES:] if code else []
            for _, code, output in results
        ]
        self._kept(
            "verify",
            {
                "results": [
                    {"command": command, "exit_code": code, "tail": "\n".join(tail)}
                    for (command, code, _), tail in zip(results, tails, strict=True)
                ]
            },
        )
        for (command, code, _), tail in zip(results, tails, strict=True):
            self._show(VerifyExited(command, code))  # kept above, with its tail
            if not tail:
                continue
            if self.as_json:
                self._json("verify_output", {"command": command, "exit_code": code, "lines": tail})
            else:
                self._agent("\n".join(tail), "dim")

    def flush_text(self) -> None:
        if self._text.strip():
            self._paragraph(self._text)
        self._text = ""

    def _paragraph(self, text: str) -> None:
        self._agent(text.strip())

    def _result(self, event: ToolResultEvent) -> None:
        code = f"exit {event.exit_code}" if event.exit_code is not None else "done"
        colour = ("red",) if event.is_error or (event.exit_code or 0) != 0 else ("green",)
        lines = event.output.rstrip().splitlines()
        shown = self._streamed.pop(event.id, None)
        if shown is not None:  # its output was shown as it came
            self._write(f"{self._elapsed()}   {code} ({shown} lines, shown above)", *colour)
            return
        self._write(f"{self._elapsed()}   {code} ({len(lines)} lines)", *colour)
        if lines:
            self._agent("\n".join(line[:200] for line in lines[:RESULT_LINES]), "dim")
        if len(lines) > RESULT_LINES:
            self._write(f"          … {len(lines) - RESULT_LINES} more lines", "dim")
