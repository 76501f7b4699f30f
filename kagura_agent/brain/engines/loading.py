"""An engine's library, loaded without stopping the entrypoint.

The entrypoint answers the host (a wall budget extension, a renewed lease, a steering
message) on the event loop the engine runs on, and the host waits 10 s for each answer.
An engine's library can take that long to import on a busy machine (``claude_agent_sdk``
takes ~1 s in the agent image when the machine is quiet), so it is imported in a worker
thread while the loop goes on answering.
"""

from __future__ import annotations

import asyncio
import importlib


async def load(module: str) -> None:
    """Import ``module`` (once; later calls find it loaded) off the event loop."""
    await asyncio.to_thread(importlib.import_module, module)
