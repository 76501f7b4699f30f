"""``runtime: host``: the brain runs on this machine, unsandboxed, as the operator allowed.

The same entrypoint and channel as in a container, over a local process's pipes; the
credential files go to a private 0700 temporary directory removed afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence

from kagura_agent.apply.midrun.hostmem import open_host_memory
from kagura_agent.apply.records import progress
from kagura_agent.apply.run.context import BrainOutcome, RunContext, RunReport
from kagura_agent.apply.run.turn import drive_brain
from kagura_agent.apply.run.verify import verify_on_host
from kagura_agent.brain.channel import BrainChannel
from kagura_agent.brain.streams import start_local_entrypoint
from kagura_agent.hostproc import environment
from kagura_agent.membrane.leases import Lease


def run_on_host(ctx: RunContext, leases: Sequence[Lease]) -> RunReport:
    """The brain as a local process, then the verify commands on the host."""
    creds = tempfile.mkdtemp(prefix="kagura-creds-")
    os.chmod(creds, 0o700)
    try:
        ctx.live.emit(progress.HostBrainStarting())
        brain = asyncio.run(_drive(ctx, leases, creds))
    finally:
        shutil.rmtree(creds, ignore_errors=True)
    commands = ctx.plan["task"]["verify"]
    if not commands:
        return RunReport(brain)
    ctx.live.emit(progress.Verifying(len(commands), on_host=True))
    root = ctx.plan["task"]["project_root"]
    verify = tuple(verify_on_host(commands, root, host_brain_environment()))
    ctx.live.verify(list(verify))
    return RunReport(brain, verify)


def host_brain_environment() -> dict[str, str]:
    """What the brain and the verify commands get on the host: a PATH (absolute entries
    only) and a HOME, not the operator's environment (its secrets stay in apply)."""
    return environment(
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")},
        base={},
    )


async def _drive(ctx: RunContext, leases: Sequence[Lease], creds: str) -> BrainOutcome:
    env = {**host_brain_environment(), "KAGURA_CREDS_DIR": creds}
    stream = await start_local_entrypoint(env=env)
    channel = BrainChannel(
        stream,
        memory=open_host_memory(ctx.plan, ctx.run_id, ctx.live.redactor),
        on_stop=stream.proc.terminate,
        on_kill=stream.proc.kill,
    )
    return await drive_brain(ctx, channel, leases)
