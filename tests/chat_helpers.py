"""Shared by the chat transport tests: a guard against traffic beyond loopback, and a
transport running in a thread as the cockpit runs it."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from apply_helpers import NOWHERE, token_provider

from kagura_agent.cockpit.transport import Event, Transport


def loopback_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any name lookup other than 127.0.0.1 fails, and fails the test afterwards too
    (so a default slack.com or discord.com URL left anywhere is caught)."""
    elsewhere: list[object] = []
    resolve = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", b"127.0.0.1"):
            elsewhere.append(host)
            raise OSError(f"test guard: no traffic beyond 127.0.0.1 (asked for {host!r})")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield
    assert elsewhere == []


class RunningTransport:
    """``transport.run`` in a thread, its events in a queue; ready once ``connected()``."""

    def __init__(
        self, transport: Transport, connected: Callable[[], None], handle: Any = None
    ) -> None:
        self.transport = transport
        self.events: queue.Queue[Event] = queue.Queue()
        self.error: BaseException | None = None
        self._handle = handle or self.events.put
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        connected()

    def _run(self) -> None:
        try:
            self.transport.run(self._handle)
        except BaseException as exc:
            self.error = exc

    def next_event(self) -> Event:
        return self.events.get(timeout=5)

    def stop(self) -> float:
        """Stop the transport; return how long run() took to return."""
        started = time.monotonic()
        self.transport.stop()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "run() did not return after stop()"
        assert self.error is None
        return time.monotonic() - started


# --- a scripted cockpit session, the same on every transport -----------------------------

# A run that holds a leased credential, an egress proxy, its network and volume: what a
# stop must take down. The script brain sleeps, so the run lasts until it is stopped.
LEASED = (
    token_provider(),
    NOWHERE,
)
LEASED_SPEC = {"egress": ["nowhere"], "credentials": [{"provider": "token", "scope": "use"}]}
CANARY = "kagura-cockpit-canary-" + "k" * 24
API_KEY = "sk-ant-kagura-canary-" + "c" * 30
LONG_LINES = 400  # `run say: 400`: the fake claude's answer, ~12 KB: a file on every chat


def session_world(base: Any, docker_client: Any, transport: dict[str, Any] | None) -> Any:
    """What a scripted session needs: the agent test image (fake claude), manifests with
    it, the leased set and ``transport``; a project root for `run TEXT`; a task that
    sleeps holding a lease; a standing graduation proposal (egress:docs); and serve's
    argv and environment."""
    import os
    import sys

    from apply_helpers import make_project, manifest_set, write_task

    from testing.agent_test_image import ensure_agent_test_image

    image = ensure_agent_test_image(docker_client)
    documents: list[dict[str, Any]] = [
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
        *LEASED,
    ]
    if transport is not None:
        documents.append(transport)
    manifests = manifest_set(base / "m", *documents)
    # egress:docs has earned a graduation proposal (two verified successes, lowered knobs):
    # serve asks for it in the operators' channel as it starts.
    (manifests / "graduation.yml").write_text(EAGER_GRADUATION)
    earn("egress:docs")
    project = make_project(base, "chat-project")
    stoppable = write_task(
        make_project(base, "stoppable"),
        "stoppable",
        {"steps": ['test -n "$TEST_TOKEN"', "sleep 600"], **LEASED_SPEC},
    )
    argv = [sys.executable, "-m", "kagura_agent", "serve", "--manifests", str(manifests),
            "--project-root", str(project), "--image", "agent-test"]  # fmt: skip
    if transport is not None:
        argv += ["--transport", transport["metadata"]["name"]]
    env = {**os.environ, "NO_COLOR": "1", "KAGURA_TEST_TOKEN": CANARY, "ANTHROPIC_API_KEY": API_KEY}
    return argv, env, stoppable


EAGER_GRADUATION = """\
apiVersion: kagura.dev/v1
kind: Graduation
metadata: {name: default}
spec: {min_successes: 2, min_distinct_tasks: 1, cooldown: 1s}
"""


def earn(category: str) -> None:
    """Two verified successes of ``category``, two seconds apart, ending a minute ago."""
    from datetime import UTC, datetime, timedelta

    from kagura_agent.clock import FixedClock
    from kagura_agent.graduation import record_outcome
    from kagura_agent.state import open_store

    clock = FixedClock(datetime.now(UTC) - timedelta(minutes=1))
    with open_store() as store:
        for n in (1, 2):
            record_outcome(
                store, [category], f"run-earned-{n}", "t", "sha256:f", [("true", 0)], clock
            )
            clock.advance(timedelta(seconds=2))


def long_answer_lines() -> list[str]:
    return [f"line {i:05d} of the long answer" for i in range(LONG_LINES)]
