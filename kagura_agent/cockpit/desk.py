"""What every job of the cockpit shares: its transport and settings, the sessions it
holds in memory (running, queued, followed), the timers of its open requests, and
posting to a thread.

The jobs (launch.py, sessions.py, control.py, status.py, graduations.py) each take the
one ``Desk`` the Cockpit (core.py) makes; every in-memory table here is read and changed
under ``lock``.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kagura_agent.clock import Clock
from kagura_agent.cockpit.midrun import MidRunDesk
from kagura_agent.cockpit.registry import Registry, Session
from kagura_agent.cockpit.runner import AdoptedRun, ApplyProcess, Pacer, Progress, Relay, TeamRun
from kagura_agent.cockpit.transport import Transport
from kagura_agent.hygiene import neutralise
from kagura_agent.paths import state_dir
from kagura_agent.state import Location, state_location

GRADUATION_PREFIX = "g-"  # request ids of graduation proposals (sessions are s-…)

Run = ApplyProcess | AdoptedRun | TeamRun  # a session's apply, as the cockpit follows it


@dataclass(frozen=True)
class CockpitConfig:
    operators: frozenset[str]
    manifests: str | None = None
    approval_timeout: float = 600.0
    # `run TEXT` tasks: their project root (default: the current directory) and image.
    project_root: Path | None = None
    image: str | None = None
    state: Location | None = None  # the state store (default: the configured one)
    plans_dir: Path | None = None  # saved plans of sessions (default: beside the state store)
    env: dict[str, str] | None = field(default=None, repr=False)  # for apply (default: ours)
    # The operators' channel (a thread id of the transport: "C0123OPS", "tty"): graduation
    # proposals go there; without one, to the thread of the run that made them eligible.
    channel: str | None = None
    # Team mode: the queue's PostgreSQL. An approved session is queued for the team's
    # runners (team/queue.enqueue_plan) instead of applied here, and followed from there.
    queue_url: str | None = None


class Desk:
    def __init__(self, transport: Transport, config: CockpitConfig, clock: Clock) -> None:
        self.transport = transport
        self.config = config
        self.clock = clock
        self.state = config.state or state_location()
        beside = self.state.parent if isinstance(self.state, Path) else state_dir()
        self.plans_dir = config.plans_dir or beside / "cockpit-plans"
        self.registry = Registry(self.state, self.clock)
        self.lock = threading.Lock()
        self.runs: dict[str, Run] = {}
        self.threads: dict[str, threading.Thread] = {}
        # Open requests (sessions awaiting approval, graduation proposals) -> their timer.
        self.timers: dict[str, threading.Timer] = {}
        # Sessions whose apply runs (started or adopted), and those queued behind them.
        self.active: dict[str, Session] = {}
        self.queue: list[Session] = []
        self.behind: dict[str, str] = {}  # queued session -> the one it waits for
        self.progress: dict[str, Progress] = {}
        self.pacer = Pacer(float(getattr(transport, "post_interval", 0.0)))
        self.midrun = MidRunDesk(self.state, self.clock)  # mid-run questions (m-…)

    def say(self, thread: str, text: str) -> None:
        try:
            self.pacer.note(channel_of(thread))
            self.transport.say(thread, neutralise(text))
        except Exception as exc:  # the chat being down must not take the cockpit down
            print(f"cockpit: could not post to {thread}: {exc}", file=sys.stderr)

    def attach(self, thread: str, filename: str, content: str, comment: str) -> None:
        """A long output, whole (a Relay calls this; errors reach its own handler)."""
        self.transport.attach(thread, filename, neutralise(content), neutralise(comment))

    def relay(self, thread: str) -> Relay:
        """A run's output to ``thread``, batched within the chat's rate limit."""
        return Relay(
            lambda text: self.say(thread, text),
            attach=lambda name, content, comment: self.attach(thread, name, content, comment),
            max_chars=int(getattr(self.transport, "max_chars", 4000)),
            pacer=self.pacer,
            channel=channel_of(thread),
        )

    def offer_stop(self, session: Session, text: str) -> None:
        """Post ``text`` with the ❌ Stop button for ``session`` (kill still works by name
        when the post fails)."""
        try:
            self.transport.offer_stop(session.thread, neutralise(text), session.id)
        except Exception as exc:
            print(f"cockpit: could not post to {session.thread}: {exc}", file=sys.stderr)

    def cancel_timer(self, request: str) -> None:
        with self.lock:
            timer = self.timers.pop(request, None)
        if timer is not None:
            timer.cancel()

    def running_in(self, thread: str) -> str | None:
        """The session running (or queued) in ``thread``, if any."""
        with self.lock:
            found = [s.id for s in [*self.active.values(), *self.queue] if s.thread == thread]
        return found[-1] if found else None


def channel_of(thread: str) -> str:
    return thread.partition(":")[0]


def usd(cost: float | None) -> str:
    return "$-" if cost is None else f"${cost:.4f}"
