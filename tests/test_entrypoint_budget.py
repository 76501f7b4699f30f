"""The container's entrypoint takes a wall budget extension whenever its turn runs,
including before the turn's own clock started: the host asks as soon as its clock starts
(a 12 s budget with a 30 s answer floor is asked about at once), and on a loaded machine
that message is read before the turn's engine has even loaded."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

from kagura_agent.brain.creds_dir import CredentialDir
from kagura_agent.brain.entrypoint import Entrypoint, Outbox
from kagura_agent.brain.memory_bridge import BridgeMemory
from kagura_agent.brain.protocol import Budget, Turn


def _run(tmp_path: Path, *, extend_to: float | None) -> list[dict[str, Any]]:
    """One turn of a 0.5 s step under a 0.2 s wall budget; the extension (if any) is the
    message right after the turn, handled before the turn's task ever ran."""
    stream = io.BytesIO()
    out = Outbox(stream)
    app = Entrypoint(out, CredentialDir(tmp_path / "creds"), BridgeMemory(out.send))
    turn = Turn(steps=("sleep 0.5",), budget=Budget(wall_seconds=0.2), cwd=str(tmp_path))

    async def main() -> None:
        assert app.handle({"type": "turn", **turn.to_json()})
        if extend_to is not None:
            assert app.handle({"type": "budget", "lease": "1", "wall_seconds": extend_to})
        assert app.turn_task is not None
        await asyncio.wait_for(app.turn_task, 30)

    asyncio.run(main())
    return [json.loads(line) for line in stream.getvalue().decode().splitlines()]


def test_an_extension_read_before_the_turn_started_is_taken(tmp_path: Path) -> None:
    sent = _run(tmp_path, extend_to=5.0)
    assert {"type": "budget-extended", "lease": "1", "taken": True} in sent
    assert sent[-1]["type"] == "done", sent
    assert not [m for m in sent if m["type"] == "error"], sent


def test_without_it_the_turn_overruns_its_budget(tmp_path: Path) -> None:
    sent = _run(tmp_path, extend_to=None)
    assert sent[-1] == {
        "type": "error",
        "message": "the turn overran its wall-clock budget",
        "code": "timeout",
    }, sent


def test_no_turn_running_takes_no_extension(tmp_path: Path) -> None:
    stream = io.BytesIO()
    out = Outbox(stream)
    app = Entrypoint(out, CredentialDir(tmp_path / "creds"), BridgeMemory(out.send))
    assert app.handle({"type": "budget", "lease": "7", "wall_seconds": 5.0})
    assert json.loads(stream.getvalue()) == {
        "type": "budget-extended",
        "lease": "7",
        "taken": False,
    }
