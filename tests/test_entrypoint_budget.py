"""The container's entrypoint takes a wall budget extension whenever its turn runs,
including before the turn's own clock started: the host asks as soon as its clock starts
(a 12 s budget with a 30 s answer floor is asked about at once), and on a loaded machine
that message is read before the turn's engine has even loaded."""

from __future__ import annotations

import asyncio
import importlib.abc
import io
import json
import sys
import time
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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


class _SlowImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``claude_agent_sdk`` as a busy machine imports it: found at once, then slow to run
    (here it then fails, so that no CLI is started)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        return ModuleSpec(name, self) if name == "claude_agent_sdk" else None

    def exec_module(self, module: ModuleType) -> None:
        time.sleep(self.seconds)
        raise ImportError("no claude_agent_sdk in this test")


def test_the_host_is_answered_while_the_engine_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sdk engine's library loads while the host's extension comes in: the entrypoint
    answers at once instead of after the import (seen in CI under load: "approved, but the
    container did not take the new deadline" when the import outlasted the host's wait)."""
    monkeypatch.delitem(sys.modules, "claude_agent_sdk", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_SlowImport(2.0), *sys.meta_path])
    stream = io.BytesIO()
    out = Outbox(stream)
    app = Entrypoint(out, CredentialDir(tmp_path / "creds"), BridgeMemory(out.send))
    turn = Turn(engine="sdk", prompt="hello", budget=Budget(wall_seconds=30), cwd=str(tmp_path))
    answered_after: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert app.handle({"type": "turn", **turn.to_json()})
        await asyncio.sleep(0.2)  # the turn's task runs and starts loading its engine
        asked = loop.time()
        await asyncio.sleep(0)  # as the reader thread hands a message to the loop
        assert app.handle({"type": "budget", "lease": "1", "wall_seconds": 60.0})
        answered_after.append(loop.time() - asked)
        assert app.turn_task is not None
        await asyncio.wait_for(app.turn_task, 30)

    asyncio.run(main())
    sent = [json.loads(line) for line in stream.getvalue().decode().splitlines()]
    assert {"type": "budget-extended", "lease": "1", "taken": True} in sent
    assert answered_after[0] < 1.0, answered_after  # not held up by the 2 s import
    assert sent[-1]["type"] == "error" and "claude_agent_sdk" in sent[-1]["message"], sent
