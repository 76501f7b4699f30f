"""Apply processes started ahead of the job: a queued run does not wait for Python.

Each child is the ``kagura-agent`` entry point (``cli.main``) in a fresh interpreter that
has already imported apply's modules and built the parser, blocked on one line of stdin:
the argv of its one command. The runner keeps ``size`` of them ready and hands one to each
job (``apply PLAN --json --run-id ID``), so the job's own code path is exactly the CLI's.
A child dies with the runner (PR_SET_PDEATHSIG, SIGKILL): a runner killed with ``kill -9``
takes its runs with it, as a host that vanished would. Closing stdin dismisses an idle one.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import signal
from collections.abc import Sequence

from kagura_agent.hostproc import kagura_environment, python_code_argv, start

PR_SET_PDEATHSIG = 1

CHILD = (
    "import json, sys\n"
    "import kagura_agent.cli.main as cli\n"
    "import kagura_agent.apply.run.executor, kagura_agent.apply.run.freshness, kagura_agent.cli.apply\n"
    "cli.build_parser()\n"
    "line = sys.stdin.readline()\n"
    "if not line.strip():\n"
    "    raise SystemExit(0)\n"
    "raise SystemExit(cli.main(json.loads(line)))\n"
)

Child = asyncio.subprocess.Process


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the runner dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def spawn() -> Child:
    """A warm child: isolated, started in the file system's root with the operator's
    environment (hostproc): the folder the runner was started from, and the one each plan
    was made from (apply's freshness check re-plans there), may be an agent's root."""
    return await start(
        python_code_argv(CHILD),
        env=kagura_environment(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=die_with_parent,
    )


class WarmChildren:
    """Up to ``size`` idle children, refilled in the background as jobs take them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ready: list[Child] = []
        self._filling: asyncio.Task[None] | None = None

    def refill(self) -> None:
        if self._filling is None or self._filling.done():
            self._filling = asyncio.create_task(self._fill())

    async def _fill(self) -> None:
        while len(self._ready) < self.size:
            self._ready.append(await spawn())

    async def run(self, argv: Sequence[str]) -> Child:
        """A child running ``kagura-agent ARGV`` (a warm one when one is ready)."""
        child = None
        while self._ready and child is None:
            candidate = self._ready.pop(0)
            child = candidate if candidate.returncode is None else None
        if child is None:
            child = await spawn()
        self.refill()
        assert child.stdin is not None
        child.stdin.write((json.dumps(list(argv)) + "\n").encode())
        await child.stdin.drain()
        child.stdin.close()
        return child

    async def close(self) -> None:
        if self._filling is not None:
            self._filling.cancel()
        for child in self._ready:
            if child.stdin is not None:
                child.stdin.close()
        for child in self._ready:
            await child.wait()
        self._ready.clear()
