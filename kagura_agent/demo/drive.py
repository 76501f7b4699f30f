"""Running the demo's task through ``apply`` as the cockpit does, and showing it.

apply runs as a child (``--json --steer-stdin``, the way ``serve`` starts it), so the run
is any run: plan, approvals, leases, the proxy, the hardened container with the real CLI,
verify, aftercare. Its live events are shown here line by line (the chat's rendering:
cockpit/runner.chat_line), the agent's text framed as the agent's. When the agent asks
for access mid-run (an ``ask`` event), the demo first steers the agent with a message (as
an operator would from chat; the message rides with the pending tool's result) and then
puts the question to the operator on this terminal, or, with ``--yes``, answers it itself
and says so. The answer goes to the approval log the asking apply reads, as every
cockpit's does (approvals/midrun.record_answer), then a nudge on apply's stdin.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, TextIO

from kagura_agent.approvals.asking import operator_name, tty_prompt
from kagura_agent.approvals.midrun import Asked, record_answer
from kagura_agent.clock import SystemClock
from kagura_agent.cockpit.runner import chat_line
from kagura_agent.demo.world import TOKEN, TOKEN_ENV, World
from kagura_agent.errors import SetupError
from kagura_agent.hostproc import kagura_argv, kagura_environment, popen
from kagura_agent.hygiene import agent_lines, neutralise
from kagura_agent.state import STATE_FILE, StateStore

STEERING = "Please also write down in NOTES.md that this message came from the operator."
# Variables the demo's apply never gets: it takes no key and keeps its own state.
WITHHELD = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "KAGURA_AGENT_STATE_URL",
)
APPROVAL_TIMEOUT = 120.0
STOP_GRACE = 60.0  # seconds apply gets to clean up after SIGINT

# (question, timeout) -> True/False, None on silence: the terminal's prompt.
Ask = Callable[[str, float], "bool | None"]
# (prompt, default, timeout) -> the operator's message
Read = Callable[[str, str, float], str]


@dataclass
class Seen:
    """What the demo saw of the run (for its summary and its tests)."""

    tool_calls: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    steering: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0


def demo_environment(world: World) -> dict[str, str]:
    """The environment of the demo's kagura-agent children: the operator's, without any
    model key or state store of theirs, with the demo's own state and endpoint token."""
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD}
    env.update({"KAGURA_AGENT_STATE_DIR": str(world.state), TOKEN_ENV: TOKEN, "NO_COLOR": "1"})
    return kagura_environment(base=env)


def read_line(prompt: str, default: str, timeout: float) -> str:
    """A line from the terminal (``default`` on an empty line, EOF or silence)."""
    sys.stderr.write(f"{prompt}\n  [Enter: {default!r}] (in {timeout:g}s) > ")
    sys.stderr.flush()
    # Bytes straight from the descriptor, as tty_prompt reads the approval after it: a line
    # in Python's buffer would be unseen by its select().
    fd = sys.stdin.fileno()
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n") and len(line) < 4096:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1) if ready else b""
        if not chunk:  # silence or EOF
            break
        line += chunk
    return line.decode(errors="replace").strip()[:2000] or default


def run_apply(
    world: World,
    out: TextIO,
    *,
    yes: bool,
    wall_seconds: float,
    ask: Ask = tty_prompt,
    read: Read = read_line,
) -> Seen:
    """Apply the demo task, show it on ``out``, answer its question; the run's outcome."""
    argv = kagura_argv(
        "apply",
        "--yes",
        "--json",
        "--steer-stdin",
        "--approval-timeout",
        f"{APPROVAL_TIMEOUT:g}",
        "--manifests",
        str(world.manifests),
        str(world.task),
    )
    proc = popen(
        argv,
        env=demo_environment(world),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a Ctrl-C here reaches apply once, from us
    )
    seen = Seen()
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True).start()
    deadline = time.monotonic() + wall_seconds
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    out.write(f"the demo ran past {wall_seconds:g}s: stopping it\n")
                    stop(proc)
                    break
                continue
            if line is None:
                break
            _show(line, out, seen, proc, world, yes=yes, ask=ask, read=read)
    except BaseException:
        stop(proc)
        raise
    stdout = proc.stdout.read() if proc.stdout is not None else ""
    seen.exit_code = proc.wait()
    seen.result = _result(stdout)
    return seen


def _result(stdout: str) -> dict[str, Any]:
    """The result object ``apply --json`` prints last on stdout (indented JSON), or {}."""
    start = stdout.rfind("\n{\n")
    start = 0 if start < 0 else start + 1
    try:
        found = json.loads(stdout[start:])
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def stop(proc: subprocess.Popen[str]) -> None:
    """Interrupt apply (it removes its run's containers, proxy and networks) and wait."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _pump(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    if stream is not None:
        for line in stream:
            lines.put(line)
    lines.put(None)


def _show(
    line: str,
    out: TextIO,
    seen: Seen,
    proc: subprocess.Popen[str],
    world: World,
    *,
    yes: bool,
    ask: Ask,
    read: Read,
) -> None:
    try:
        item = json.loads(line)
    except ValueError:
        item = None
    if not isinstance(item, dict):
        shown = chat_line(line)
        if shown:
            out.write(shown + "\n")
        return
    if item.get("kind") == "ask":
        _answer(item, out, seen, proc, world, yes=yes, ask=ask, read=read)
        return
    if item.get("kind") == "brain" and item.get("type") == "tool_call":
        seen.tool_calls.append(str(item.get("name")))
    if item.get("kind") == "brain" and item.get("type") == "tool_result":
        # The tool's answer, its first line: the agent's (its files, its commands).
        first = (str(item.get("output") or "").strip().splitlines() or [""])[0][:200]
        mark = "✗ failed:" if item.get("is_error") else "◂"
        out.write("\n".join(agent_lines(f"{mark} {first}")) + "\n")
        out.flush()
        return
    if item.get("kind") == "brain" and item.get("type") in ("text", "done"):
        text = str(item.get("text") or item.get("result") or "").strip()
        if text and item.get("type") == "text":
            out.write("\n".join(agent_lines(text)) + "\n")
        return
    shown = chat_line(line)
    if shown:
        out.write(shown + "\n")
    out.flush()


def _answer(
    item: dict[str, Any],
    out: TextIO,
    seen: Seen,
    proc: subprocess.Popen[str],
    world: World,
    *,
    yes: bool,
    ask: Ask,
    read: Read,
) -> None:
    question = neutralise(str(item.get("text", "")))
    seen.questions.append(question)
    # First the steering message: the agent's tool call waits on this question, so the
    # message reaches the CLI with that call's result.
    if yes:
        message = STEERING
        out.write(f"» steering the agent (--yes: the demo's message): {message}\n")
    else:
        message = read("» Send the agent a message while it works (steering):", STEERING, 60.0)
    seen.steering.append(message)
    _send(proc, {"text": message})
    out.write(f"? the agent asks, mid-run:\n{question}\n")
    out.flush()
    if yes:
        approved: bool | None = True
        out.write("» --yes: answered yes on the operator's behalf\n")
    else:
        approved = ask("Approve?", APPROVAL_TIMEOUT - 5)
    seen.answers.append({True: "approved", False: "denied", None: "no answer"}[approved])
    if approved is None:
        return  # apply's own timeout denies it, and says so
    with StateStore(world.state / STATE_FILE) as store:
        record_answer(
            store,
            Asked(str(item["request"]), str(item["category"]), str(item["fingerprint"])),
            approved=approved,
            who="demo:--yes" if yes else operator_name(),
            via="demo",
            clock=SystemClock(),
            reason="answered in kagura-agent demo",
        )
    _send(proc, {"answered": str(item["request"])})
    out.flush()


def _send(proc: subprocess.Popen[str], message: dict[str, str]) -> None:
    if proc.stdin is None or proc.poll() is not None:
        raise SetupError("the demo's apply ended before it could be answered")
    proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()
