"""One session's apply, as its own process, with its progress relayed to chat.

The cockpit never applies in-process: ``kagura-agent apply --yes --json PLAN.json`` does,
with its own signal handling, lock, sweeps and clean-up, exactly as an operator's shell
would run it. Its stderr carries one JSON line per live event; the relay turns the ones
an operator follows (phases, tool calls, denials, errors) into short chat lines, batched
so a chat service's rate limit is never the bottleneck. Interrupting is SIGINT, which
apply answers by cleaning up and exiting 130.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from kagura_agent.clock import iso

BATCH_SECONDS = 1.5
MAX_BATCH_LINES = 40
DETAIL_CHARS = 160


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    run_id: str | None
    outcome: str  # the run's own word: success | failed | interrupted | ...; or "error"
    wall_seconds: float | None


def apply_argv(plan_path: Path, approvals_since: datetime | None) -> list[str]:
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
    if approvals_since is not None:
        argv += ["--approvals-since", iso(approvals_since)]
    return [*argv, str(plan_path)]


def chat_line(line: str) -> str | None:
    """What of one stderr line of ``apply --json`` goes to chat (None: nothing)."""
    try:
        item = json.loads(line)
    except ValueError:
        return line.rstrip() or None  # "error: …" and its hint, from apply itself
    if not isinstance(item, dict):
        return None
    kind = item.get("kind")
    if kind == "phase":
        return f"● {item.get('message', '')}"
    if kind == "note":
        return f"  {item.get('message', '')}"
    if kind == "egress":
        if item.get("decision") == "deny":
            return f"⊘ egress denied {item.get('host')}:{item.get('port')}"
        return None
    if kind == "brain":
        return _brain_line(item)
    if kind == "incident":
        return f"⚠ incident {item.get('id')}: {item.get('reason')} (kagura-agent incidents)"
    return None


def _brain_line(item: dict[str, Any]) -> str | None:
    kind = item.get("type")
    if kind == "tool_call":
        from kagura_agent.apply.live import tool_call_detail

        detail = tool_call_detail(item.get("input") or {})
        return f"▸ {item.get('name')}: {detail[:DETAIL_CHARS]}"
    if kind == "error":
        return f"✗ brain error ({item.get('code')}): {item.get('message')}"
    if kind == "done" and item.get("result"):
        return f"  {str(item['result'])[:500]}"
    return None


class Relay:
    """Collects chat lines and posts them in batches from its own thread."""

    def __init__(self, post: Callable[[str], None], interval: float = BATCH_SECONDS) -> None:
        self._post = post
        self._interval = interval
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cockpit-relay", daemon=True)
        self._thread.start()

    def add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def _flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        while lines:
            chunk, lines = lines[:MAX_BATCH_LINES], lines[MAX_BATCH_LINES:]
            try:
                self._post("\n".join(chunk))
            except Exception as exc:  # a chat hiccup must not stop the run or the relay
                print(f"cockpit: could not post progress: {exc}", file=sys.stderr)

    def _loop(self) -> None:
        while not self._closed.wait(self._interval):
            self._flush()

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._flush()


class ApplyProcess:
    """A started ``apply``; :meth:`wait` relays its progress and returns its outcome."""

    def __init__(self, argv: Sequence[str], relay: Relay, env: dict[str, str] | None = None):
        self.relay = relay
        child_env = {**(env if env is not None else os.environ), "NO_COLOR": "1"}
        # Its own process group: a Ctrl-C at the cockpit's terminal reaches the cockpit,
        # which interrupts each run itself, in order.
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
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

    def wait(self) -> RunOutcome:
        stdout: list[str] = []
        reader = threading.Thread(
            target=_drain, args=(self.process.stdout, stdout), name="cockpit-stdout", daemon=True
        )
        reader.start()
        assert self.process.stderr is not None
        for line in self.process.stderr:
            said = chat_line(line)
            if said:
                self.relay.add(said)
        code = self.process.wait()
        reader.join()
        self.relay.close()
        try:
            result = json.loads("".join(stdout))
        except ValueError:
            result = None
        if not isinstance(result, dict) or "outcome" not in result:
            # No result, or the --json error envelope (apply refused or failed to start).
            return RunOutcome(code, None, "error", None)
        return RunOutcome(
            code, result.get("run_id"), str(result.get("outcome")), result.get("wall_seconds")
        )


class AdoptedRun:
    """An apply a previous cockpit started and that outlived it (apply keeps going when
    nobody reads its output). Its progress is not relayed; its outcome is read from the
    ``runs`` table once the process is gone."""

    def __init__(
        self, pid: int, pid_start: str | None, state_path: Path, poll: float = 1.0
    ) -> None:
        self.pid = pid
        self.pid_start = pid_start
        self.state_path = state_path
        self.poll = poll

    def alive(self) -> bool:
        from kagura_agent.membrane.leases.ledger import owner_alive

        return owner_alive(self.pid, self.pid_start)

    def interrupt(self) -> None:
        if self.alive():  # the same process, not a recycled pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGINT)

    def wait(self) -> RunOutcome:
        while self.alive():
            time.sleep(self.poll)
        return self.outcome()

    def outcome(self) -> RunOutcome:
        from kagura_agent.state import StateStore

        with StateStore(self.state_path) as store:
            try:
                row = store.conn.execute(
                    "SELECT run_id, outcome, exit_code FROM runs WHERE pid = ? AND pid_start IS ?"
                    " ORDER BY started_at DESC LIMIT 1",
                    (self.pid, self.pid_start),
                ).fetchone()
            except sqlite3.OperationalError:  # no runs table: it never got as far as a run
                row = None
        if row is None or row["exit_code"] is None:  # killed before it could record an end
            return RunOutcome(-1, row["run_id"] if row else None, "lost", None)
        return RunOutcome(int(row["exit_code"]), row["run_id"], str(row["outcome"]), None)


def _drain(stream: IO[str] | None, into: list[str]) -> None:
    if stream is not None:
        into.extend(stream)
