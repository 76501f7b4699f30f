"""One session's apply, as its own process, with its progress relayed to chat.

The cockpit never applies in-process: ``kagura-agent apply --yes --json PLAN.json`` does,
with its own signal handling, lock, sweeps and clean-up, exactly as an operator's shell
would run it. Its stderr carries one JSON line per live event; the feed turns the ones
an operator follows (phases, tool calls, denials, errors, what the assistant says, the
final answer) into chat posts, and the relay batches them by time and size within the
chat's rate limit; a long text goes whole as a file, never cut. Interrupting is SIGINT, which
apply answers by cleaning up and exiting 130.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from kagura_agent.apply.records import progress
from kagura_agent.apply.records.live import egress_line, tool_call_detail
from kagura_agent.brain.events import MAX_TEXT_CHARS
from kagura_agent.clock import iso
from kagura_agent.hostproc import kagura_argv, kagura_environment, popen
from kagura_agent.hygiene import agent_lines, neutralise
from kagura_agent.processes import owner_alive
from kagura_agent.state import Location, MissingTable, StateStore

BATCH_SECONDS = 1.5
MAX_BATCH_LINES = 40
DETAIL_CHARS = 160
# An assistant text longer than this many lines is posted whole as a file, as is one longer
# than the chat's max_chars: a wall of text in a thread is unreadable, and cutting it is lying.
ATTACH_LINES = 30


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    run_id: str | None
    outcome: str  # the run's own word: success | failed | interrupted | ...; or "error"
    wall_seconds: float | None
    cost_usd: float | None = None
    note: str | None = None  # what the thread is told besides (a team run: lost on runner X)


@dataclass
class Progress:
    """What ``status`` shows of a running session; updated from apply's live events.
    ``since``: when the phase began (time.monotonic), so status says for how long."""

    phase: str = "starting"
    cost_usd: float | None = None
    turns: int = 0
    since: float = field(default_factory=time.monotonic)

    def moved(self, phase: str) -> None:
        self.phase = phase[:80]
        self.since = time.monotonic()


def apply_argv(
    plan_path: Path, approvals_since: datetime | None, approval_timeout: float | None = None
) -> list[str]:
    argv = ["apply", "--yes", "--json", "--steer-stdin"]
    if approval_timeout is not None:  # how long a mid-run question waits for an answer
        argv += ["--approval-timeout", f"{approval_timeout:g}"]
    if approvals_since is not None:
        argv += ["--approvals-since", iso(approvals_since)]
    return kagura_argv(*argv, str(plan_path))


def chat_line(line: str) -> str | None:
    """What of one stderr line of ``apply --json`` goes to chat (None: nothing; assistant
    text and the final answer are the :class:`Feed`'s, posted whole). Our own lines stay
    one line each, whatever they quote; the agent's text (a failed verify command's output)
    comes framed line by line (hygiene.agent_lines), so it cannot pass for ours."""
    try:
        item = json.loads(line)
    except ValueError:
        return _own(line.rstrip()) or None  # "error: …" and its hint, from apply itself
    if not isinstance(item, dict):
        return None
    return _event_line(item)


def _event_line(item: dict[str, Any]) -> str | None:
    kind = item.get("kind")
    event = progress.from_json(item)
    if event is not None:  # a phase or a note, in the words its type gives it
        return _own(progress.chat_line(event))
    if kind == "verify_output":
        return "\n".join(agent_lines("\n".join(map(str, item.get("lines") or []))))
    if kind == "egress":
        return _own(egress_line(item)) or None
    if kind == "brain":
        return _brain_line(item)
    if kind == "incident":
        return _own(f"⚠ incident {item.get('id')}: {item.get('reason')} (kagura-agent incidents)")
    # A team run's events, as its runner and the reaper store them (team/runner.py).
    if kind == "runner":
        return _own(f"● {item.get('message', '')}")
    if kind == "log":
        return _own(str(item.get("message") or "").rstrip()) or None
    if kind in ("lost", "abort", "cancelled"):
        return _own(f"⚠ {item.get('message', '')}")
    return None


def _own(line: str) -> str:
    """One line of ours: a line break in what it quotes shown, not acted on."""
    return neutralise(line, newlines=False)


def _brain_line(item: dict[str, Any]) -> str | None:
    kind = item.get("type")
    if kind == "tool_call":
        detail = tool_call_detail(item.get("input") or {})
        return _own(f"▸ {item.get('name')}: {detail[:DETAIL_CHARS]}")
    if kind == "tool_output":  # a running step's output, line by line: the agent's, framed
        text = str(item.get("text") or "").rstrip("\n")
        return "\n".join(agent_lines(text)) if text else None
    if kind == "error":
        return _own(f"✗ brain error ({item.get('code')}): {item.get('message')}")
    return None


class Pacer:
    """Posts in one channel at most every ``interval`` seconds (the chat's rate limit),
    shared by every session's relay: ten runs streaming into one channel share its rate,
    and each relay batches more while it waits."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: dict[str, float] = {}
        self._lock = threading.Lock()

    def wait(self, channel: str) -> None:
        if self.interval <= 0:
            return
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next.get(channel, 0.0))
            self._next[channel] = at + self.interval
        if at > now:
            time.sleep(at - now)

    def note(self, channel: str) -> None:
        """A post that did not wait (an answer to an operator) still uses the rate."""
        if self.interval <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._next[channel] = max(now, self._next.get(channel, 0.0)) + self.interval


@dataclass(frozen=True)
class _File:
    name: str
    content: str
    comment: str


class Relay:
    """Collects a run's output and posts it in batches from its own thread: lines joined
    into messages of at most ``max_chars``, at most one post per ``pacer`` interval in the
    channel, a long text as a file (whole). Order is kept."""

    def __init__(
        self,
        post: Callable[[str], None],
        interval: float = BATCH_SECONDS,
        *,
        attach: Callable[[str, str, str], None] | None = None,
        max_chars: int = 4000,
        pacer: Pacer | None = None,
        channel: str = "",
    ) -> None:
        self._post = post
        self._attach = attach
        self._interval = interval
        self.max_chars = max_chars
        self._pacer = pacer or Pacer(0.0)
        self._channel = channel
        self._items: list[str | _File] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cockpit-relay", daemon=True)
        self._thread.start()

    def add(self, line: str) -> None:
        with self._lock:
            self._items.append(line)

    def attach(self, name: str, content: str, comment: str) -> None:
        """``content`` whole, as a file (printed in full where the chat has no files)."""
        with self._lock:
            self._items.append(_File(name, content, comment))

    def fits(self, text: str) -> bool:
        """Whether ``text`` reads well as one message rather than as a file."""
        return len(text) <= self.max_chars - 200 and text.count("\n") < ATTACH_LINES

    def _batches(self, items: list[str | _File]) -> list[str | _File]:
        out: list[str | _File] = []
        lines: list[str] = []
        size = 0
        for item in items:
            if isinstance(item, _File):
                if lines:
                    out.append("\n".join(lines))
                    lines, size = [], 0
                out.append(item)
                continue
            if len(item) > self.max_chars:  # a single overlong line: its own message(s)
                item = item[: self.max_chars - 40] + " … (line cut; see the run's record)"
            if lines and (size + len(item) + 1 > self.max_chars or len(lines) >= MAX_BATCH_LINES):
                out.append("\n".join(lines))
                lines, size = [], 0
            lines.append(item)
            size += len(item) + 1
        if lines:
            out.append("\n".join(lines))
        return out

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for batch in self._batches(items):
            self._pacer.wait(self._channel)
            try:
                if isinstance(batch, str):
                    self._post(batch)
                elif self._attach is not None:
                    self._attach(batch.name, batch.content, batch.comment)
                else:
                    self._post(f"{batch.comment}\n{batch.content}")
            except Exception as exc:  # a chat hiccup must not stop the run or the relay
                print(f"cockpit: could not post progress: {exc}", file=sys.stderr)

    def _loop(self) -> None:
        while not self._closed.wait(self._interval):
            self._flush()

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._flush()


class Feed:
    """One run's live JSON lines (apply's stderr) into its relay and its progress.

    Assistant text is posted whole: as a message when it reads as one, else as a file
    named after the session. The final answer is posted at the end, whole, the same way;
    when it is the text just posted it is named, not repeated."""

    def __init__(
        self,
        relay: Relay,
        progress: Progress,
        session_id: str,
        on_ask: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.relay = relay
        self.progress = progress
        self.session_id = session_id
        self.on_ask = on_ask  # a mid-run question of the run (posted with Approve / Deny)
        self._texts = 0
        self._last_text = ""

    def line(self, raw: str) -> None:
        said = chat_line(raw)
        if said:
            self.relay.add(said)
        try:
            item = json.loads(raw)
        except ValueError:
            return
        if not isinstance(item, dict):
            return
        if item.get("kind") == "phase":
            self.progress.moved(str(item.get("message", "")))
        elif item.get("kind") == "brain":
            self._brain(item)
        elif item.get("kind") == "runner":  # a team run taken by a runner
            self.progress.moved(str(item.get("message", "")))
        elif item.get("kind") == "ask" and self.on_ask is not None:
            self.on_ask(item)

    def _brain(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        # What the brain is doing now: status shows it (and since when), not the phase
        # the container started in.
        if kind == "tool_call":
            detail = tool_call_detail(item.get("input") or {})
            self.progress.moved(f"running {item.get('name')}: {neutralise(detail, newlines=False)}")
        elif kind == "tool_result":
            self.progress.moved("brain working")
        if kind == "cost":
            if isinstance(item.get("usd"), int | float):
                self.progress.cost_usd = float(item["usd"])
            if isinstance(item.get("turns"), int):
                self.progress.turns = int(item["turns"])
        elif kind == "text" and str(item.get("text") or "").strip():
            text = str(item["text"]).strip()
            self._texts += 1
            self._last_text = text
            self._post(text, f"{self.session_id}-text-{self._texts}.md", "💬")
        elif kind == "done" and str(item.get("result") or "").strip():
            result = str(item["result"]).strip()
            if result == self._last_text:
                self.relay.add("✓ final answer: the text above")
            else:
                self._post(result, f"{self.session_id}-answer.md", "✓ final answer:")

    def _post(self, text: str, filename: str, label: str) -> None:
        capped = (
            f"; the engine's event cap of {MAX_TEXT_CHARS // 1024} KiB was reached"
            if len(text) >= MAX_TEXT_CHARS
            else ""
        )
        framed = agent_lines(text)  # the agent's words, framed line by line
        if self.relay.fits("\n".join(framed)) and not capped:
            self.relay.add("\n".join([label, *framed]))
            return
        lines = text.count("\n") + 1
        self.relay.attach(
            filename,
            text + "\n",  # a file of the agent's, as it wrote it: a file is not our line
            # One line, ours, quoting the agent's first line after the frame.
            f"{label} ({len(text)} chars, {lines} lines, whole in {filename}{capped})"
            f" {framed[0][:120]}",
        )


class ApplyProcess:
    """A started ``apply``; :meth:`wait` relays its progress and returns its outcome."""

    def __init__(
        self,
        argv: Sequence[str],
        relay: Relay,
        env: dict[str, str] | None = None,
        feed: Feed | None = None,
    ):
        self.relay = relay
        self.feed = feed
        child_env = kagura_environment({"NO_COLOR": "1"}, base=env)
        # Its own process group: a Ctrl-C at the cockpit's terminal reaches the cockpit,
        # which interrupts each run itself, in order.
        # stdin carries steering: one {"text": ...} line per message for the running brain.
        self.process = popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def interrupt(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def steer(self, text: str) -> str | None:
        """Hand ``text`` to the run (apply passes it to the brain); None, or why not."""
        stdin = self.process.stdin
        if stdin is None or self.process.poll() is not None:
            return "its apply has ended"
        try:
            stdin.write(json.dumps({"text": text}) + "\n")
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return "its apply has ended"
        return None

    def nudge(self, request: str) -> str | None:
        """Tell the run an operator answered its question ``request`` (the decision is in
        the approval log; apply reads it there). None, or why it could not be told."""
        stdin = self.process.stdin
        if stdin is None or self.process.poll() is not None:
            return "its apply has ended"
        try:
            stdin.write(json.dumps({"answered": request}) + "\n")
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return "its apply has ended"
        return None

    def wait(self) -> RunOutcome:
        stdout: list[str] = []
        reader = threading.Thread(
            target=_drain, args=(self.process.stdout, stdout), name="cockpit-stdout", daemon=True
        )
        reader.start()
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if self.feed is not None:
                self.feed.line(line)
            else:
                said = chat_line(line)
                if said:
                    self.relay.add(said)
        code = self.process.wait()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        reader.join()
        self.relay.close()
        try:
            result = json.loads("".join(stdout))
        except ValueError:
            result = None
        if not isinstance(result, dict) or "outcome" not in result:
            # No result, or the --json error envelope (apply refused or failed to start).
            return RunOutcome(code, None, "error", None)
        cost = result.get("cost_usd")
        return RunOutcome(
            code,
            result.get("run_id"),
            str(result.get("outcome")),
            result.get("wall_seconds"),
            float(cost) if isinstance(cost, int | float) else None,
        )


class TeamRun:
    """A session's run on the team queue (``serve --queue``): a runner on some Docker host
    applies it; its events come back from the shared store (``queue.follow``) into the
    same feed and relay as a local apply's. Kill cancels it in the queue, or asks its
    runner to interrupt the apply. Steering and mid-run answers stay with the runner's
    apply (it runs without this cockpit's stdin): refused with a reason.

    When the cockpit stops it only stops following (:meth:`detach`): the run is the
    runner's, and the next cockpit follows it again from the store."""

    def __init__(self, url: str, run_id: str, relay: Relay, feed: Feed) -> None:
        self.url = url
        self.run_id = run_id
        self.relay = relay
        self.feed = feed
        self._detached = threading.Event()

    def steer(self, text: str) -> str | None:
        return "it runs on a team runner; its brain takes no messages from chat"

    def nudge(self, request: str) -> str | None:
        return "it runs on a team runner; its questions are answered where it runs"

    def interrupt(self) -> None:
        self.cancel("the cockpit")

    def cancel(self, who: str) -> str:
        """Cancel it in the queue, or ask its runner to stop it; what was done."""
        from kagura_agent.team import queue  # psycopg and apply's modules: team runs only

        return queue.cancel(self.url, self.run_id, who)

    def detach(self) -> None:
        self._detached.set()

    def wait(self) -> RunOutcome:
        from kagura_agent.team import queue

        status: dict[str, Any] | None = None
        note = None
        try:
            for item in queue.follow(self.url, self.run_id, stop=self._detached.is_set):
                if item.get("kind") == "status":
                    status = item
                    break
                if item.get("kind") == "lost":
                    note = (
                        f"lost on runner {item.get('runner') or '(none)'}: it stopped"
                        f" heartbeating; leases revoked: {item.get('leases_revoked')} of"
                        f" {item.get('leases_found', '?')} (by runner {item.get('reaped_by')})"
                    )
                self.feed.line(json.dumps(item))
        finally:
            self.relay.close()
        if status is None:
            return RunOutcome(-1, self.run_id, "detached", None)
        code = status.get("exit_code")
        outcome = str(status.get("status"))
        if note is None and outcome != "killed" and status.get("message"):
            note = str(status["message"])
        return RunOutcome(
            int(code) if isinstance(code, int) else -1, self.run_id, outcome, None, None, note
        )


class AdoptedRun:
    """An apply a previous cockpit started and that outlived it (apply keeps going when
    nobody reads its output). Its progress is not relayed; its outcome is read from the
    ``runs`` table once the process is gone."""

    def __init__(self, pid: int, pid_start: str | None, state: Location, poll: float = 1.0) -> None:
        self.pid = pid
        self.pid_start = pid_start
        self.state = state
        self.poll = poll

    def alive(self) -> bool:
        return owner_alive(self.pid, self.pid_start)

    def steer(self, text: str) -> str | None:
        return "it was adopted after a restart: its input is not this cockpit's"

    def nudge(self, request: str) -> str | None:
        return "it was adopted after a restart: it denied its open questions then"

    def interrupt(self) -> None:
        if self.alive():  # the same process, not a recycled pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGINT)

    def wait(self) -> RunOutcome:
        while self.alive():
            time.sleep(self.poll)
        return self.outcome()

    def outcome(self) -> RunOutcome:
        with StateStore(self.state) as store:
            try:
                row = store.conn.execute(
                    "SELECT run_id, outcome, exit_code FROM runs WHERE pid = ?"
                    " AND pid_start IS NOT DISTINCT FROM ?"
                    " ORDER BY started_at DESC LIMIT 1",
                    (self.pid, self.pid_start),
                ).fetchone()
            except MissingTable:  # no runs table: it never got as far as a run
                row = None
        if row is None or row["exit_code"] is None:  # killed before it could record an end
            return RunOutcome(-1, row["run_id"] if row else None, "lost", None)
        return RunOutcome(int(row["exit_code"]), row["run_id"], str(row["outcome"]), None)


def _drain(stream: IO[str] | None, into: list[str]) -> None:
    if stream is not None:
        into.extend(stream)
