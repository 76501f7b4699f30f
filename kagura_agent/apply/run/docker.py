"""The Docker implementation of :class:`~kagura_agent.apply.run.context.ApplyRuntime`.

``DockerRuntime`` (membrane/runtime.py) creates and drives the hardened containers; this
adds what apply needs on top, through the same client: the brain stream over an
attached socket, container state, exec (verify), and the run's egress proxy.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from kagura_agent.apply.run.context import ContainerState, EgressSink
from kagura_agent.brain.streams import DockerAttachStream, DuplexStream
from kagura_agent.clock import Clock
from kagura_agent.membrane.egress.local import proxy_networks
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.request import EgressRequest
from kagura_agent.membrane.egress.session import AgentNetworkConfig, EgressSession
from kagura_agent.membrane.egress.sweep import sweep_orphans
from kagura_agent.membrane.runtime import DockerRuntime, docker_errors
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

# runc's refusal to start an exec in a frozen container (the disk watch's hold), and how
# long an exec waits for the hold to end (a hold lasts one measure of the root).
PAUSED = b"cannot exec in a paused container"
PAUSED_RETRY_SECONDS = 30.0
HEAD_BYTES = 512  # of a streamed exec's output, kept to tell a refusal


class DockerApplyRuntime(DockerRuntime):
    """Docker, as apply drives it."""

    @contextlib.contextmanager
    def attach(self, container_id: str) -> Iterator[DuplexStream]:
        sock = self.attach_socket(container_id)
        try:
            yield DockerAttachStream(sock)
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def state(self, container_id: str) -> ContainerState:
        state = self.inspect(container_id)["State"]
        code = state.get("ExitCode")
        return ContainerState(
            running=bool(state.get("Running")),
            pid=int(state.get("Pid") or 0),
            exit_code=None if code is None else int(code),
        )

    def exec(
        self, container_id: str, argv: list[str], *, user: str, workdir: str
    ) -> tuple[int, bytes]:
        """Run ``argv`` in the container; (exit code, output). The disk watch holds the
        run's containers still (cgroup freezer) while it measures, and runc refuses to
        start an exec then: that refusal (nothing ran) is tried again, for a while."""
        api = self.client.api
        deadline = time.monotonic() + PAUSED_RETRY_SECONDS
        while True:
            with docker_errors(f"running {argv[-1]!r} in container {container_id[:12]}"):
                exec_id = api.exec_create(
                    container_id, argv, user=user, workdir=workdir, stdout=True, stderr=True
                )["Id"]
                output = api.exec_start(exec_id, demux=False) or b""
                code = api.exec_inspect(exec_id).get("ExitCode")
            if code == 126 and _refused(api, exec_id, output) and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            return int(code if code is not None else -1), bytes(output)

    def exec_stream(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        workdir: str,
        into: BinaryIO,
        limit: int,
    ) -> tuple[int, int, bool]:
        api = self.client.api
        start = into.tell()
        deadline = time.monotonic() + PAUSED_RETRY_SECONDS
        while True:
            once = self._stream_once(container_id, argv, user, workdir, into, limit)
            refused = once.code == 126 and once.whole and _refused(api, once.exec_id, once.head)
            if refused and time.monotonic() < deadline:
                # Nothing ran (the disk watch held the container): nothing of it is kept.
                into.seek(start)
                into.truncate()
                time.sleep(0.05)
                continue
            code = once.code
            return int(code if code is not None else -1), once.written, once.whole

    def _stream_once(
        self,
        container_id: str,
        argv: list[str],
        user: str,
        workdir: str,
        into: BinaryIO,
        limit: int,
    ) -> _Streamed:
        from docker.utils.socket import STDOUT, frames_iter

        api = self.client.api
        written, whole, head = 0, True, b""
        with docker_errors(f"running {argv[0]!r} in container {container_id[:12]}"):
            exec_id = api.exec_create(
                container_id, argv, user=user, workdir=workdir, stdout=True, stderr=False
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
            try:
                for stream, chunk in frames_iter(sock, tty=False):
                    if stream != STDOUT:
                        continue
                    if len(head) < HEAD_BYTES:
                        head += chunk[: HEAD_BYTES - len(head)]
                    if written + len(chunk) > limit:
                        into.write(chunk[: limit - written])
                        written, whole = limit, False
                        break  # the rest is never read: its socket is closed below
                    into.write(chunk)
                    written += len(chunk)
            finally:
                with contextlib.suppress(OSError):
                    sock.close()
            code = _exit_code(api, exec_id) if whole else None
        return _Streamed(exec_id, code, written, whole, head)

    def start_egress(
        self,
        plan: Plan,
        run_id: str,
        on_event: EgressSink,
        *,
        store: StateStore,
        clock: Clock,
        injection: Injection | None,
        injection_secret: str | None,
        scrub: Callable[[str], str] | None = None,
    ) -> EgressSession:
        # apply's _sweep() ran sweep_egress at the start of this run: the request does not
        # sweep again (3-4 daemon list calls per run, many at once when runs start together).
        request = EgressRequest.for_run(
            plan,
            run_id,
            injection=injection,
            injection_secret=injection_secret,
            scrub=scrub,
            # A local model endpoint's network (checked there), which only the proxy joins.
            extra_networks=proxy_networks(self.client, plan),
        )
        return EgressSession.start(self.client, request, on_event, store=store, clock=clock)

    def start_forwarder(self, container_id: str, config: AgentNetworkConfig) -> None:
        # apply creates every agent container that has egress with ``forward``: its own
        # command listens before the entrypoint runs (no exec, nothing to wait for); a
        # warm session's squid must have this run's configuration first.
        if config.wait_ready is not None:
            config.wait_ready()

    def sweep_egress(self, store: StateStore) -> list[str]:
        return sweep_orphans(self.client, store)


@dataclass(frozen=True)
class _Streamed:
    """One try of an exec whose output is streamed: its id, exit code (None: unknown),
    bytes written, whether that was all, and its first bytes (to tell a refusal)."""

    exec_id: str
    code: int | None
    written: int
    whole: bool
    head: bytes


def _refused(api: Any, exec_id: str, output: bytes) -> bool:
    """Whether runc refused to start the exec in a frozen container: no process was ever
    made (its pid 0) and the output is the refusal, or nothing at all (the daemon does not
    always pass the refusal on). A command that ran and exited 126 had a pid."""
    if output and PAUSED not in output:
        return False
    with contextlib.suppress(Exception):
        return int(api.exec_inspect(exec_id).get("Pid") or 0) == 0
    return False


def _exit_code(api: Any, exec_id: str, wait: float = 5.0) -> int | None:
    """An exec's exit code once Docker has it (its output ended: it is ending)."""
    deadline = time.monotonic() + wait
    while True:
        found = api.exec_inspect(exec_id)
        if not found.get("Running") or time.monotonic() > deadline:
            code = found.get("ExitCode")
            return None if code is None or found.get("Running") else int(code)
        time.sleep(0.05)
