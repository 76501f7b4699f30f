"""``runtime: host``: the brain runs on this machine, unsandboxed, as the operator allowed.

The same entrypoint and channel as in a container, over a local process's pipes; the
credential files go to a private 0700 temporary directory removed afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import Any

from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore


def run_on_host(
    store: StateStore,
    plan: Plan,
    run_id: str,
    leases: list[Any],
    options: Any,
    live: Any,
    result: Any,
) -> None:
    from kagura_agent.apply.verify import verify_on_host

    creds = tempfile.mkdtemp(prefix="kagura-creds-")
    os.chmod(creds, 0o700)
    try:
        live.phase("starting the brain ON THE HOST (runtime: host)")
        asyncio.run(_drive(store, plan, run_id, leases, creds, options, live, result))
    finally:
        shutil.rmtree(creds, ignore_errors=True)
    if plan["task"]["verify"]:
        live.phase(f"verifying: {len(plan['task']['verify'])} command(s) on the host")
        result.verify = verify_on_host(plan["task"]["verify"], plan["task"]["project_root"])
        live.verify(result.verify)


async def _drive(
    store: StateStore,
    plan: Plan,
    run_id: str,
    leases: list[Any],
    creds: str,
    options: Any,
    live: Any,
    result: Any,
) -> None:
    from kagura_agent.apply.hostmem import open_host_memory
    from kagura_agent.apply.session import BrainRun
    from kagura_agent.brain.channel import BrainChannel
    from kagura_agent.brain.streams import start_local_entrypoint

    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "KAGURA_CREDS_DIR": creds,
    }
    stream = await start_local_entrypoint(env=env, cwd=plan["task"]["project_root"])
    channel = BrainChannel(
        stream,
        memory=open_host_memory(plan, run_id),
        on_stop=stream.proc.terminate,
        on_kill=stream.proc.kill,
    )
    channel.start()
    try:
        await BrainRun(store, plan, leases, channel, options, live, result).run()
    finally:
        await channel.stop()
