"""The dispatch request, host side: checked before anything is planned, and carried over
the channel from a shell step (memtool) to the host's dispatcher and back. The container
runs the real entrypoint over pipes; the dispatcher is a stand-in that records requests
(tests/test_dispatch_runtime.py runs real children)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from brain_helpers import attached, collect

from kagura_agent.apply.midrun.child_request import ChildRequest, Refused, make_workdir
from kagura_agent.brain.channel import ChannelLimits
from kagura_agent.brain.events import DoneEvent, ToolResultEvent
from kagura_agent.brain.protocol import Turn


def test_a_request_is_names_and_text_with_defaults() -> None:
    child = ChildRequest.parse({"prompt": "sum up"}, "parent-1")
    assert (child.name, child.workdir, child.egress, child.steps) == (
        "parent-1",
        "parent-1",
        None,  # the parent's baseline egress
        None,
    )
    given = ChildRequest.parse(
        {"prompt": "p", "name": "fetch", "egress": [], "workdir": "a/b", "steps": ["true"]}, "x"
    )
    assert (given.name, given.egress, given.workdir, given.steps) == ("fetch", (), "a/b", ("true",))


def test_every_problem_of_a_request_is_reported_at_once() -> None:
    with pytest.raises(Refused) as caught:
        ChildRequest.parse(
            {
                "prompt": "",
                "name": "Bad Name",
                "workdir": "../outside",
                "egress": "pypi",
                "credentials": [{"provider": "aws"}],
            },
            "x",
        )
    assert caught.value.reasons == [
        "prompt must be text of 1..65536 characters",
        "name 'Bad Name' must be lowercase letters, digits and dashes",
        "workdir '../outside' must be a relative folder inside the project",
        "egress must be a list of at most 16 non-empty strings",
        "credentials must be a list of {provider, scope}",
    ]
    with pytest.raises(Refused, match="workdir '/etc'"):
        ChildRequest.parse({"prompt": "p", "workdir": "/etc"}, "x")


class SlowDispatcher:
    """Answers after ``delay`` seconds, longer than the channel's idle limit."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.requests: list[dict[str, Any]] = []

    async def dispatch(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.requests.append(dict(request))
        await asyncio.sleep(self.delay)
        return {"outcome": "success", "task": request["name"], "output_memory": "mem-1"}


def test_memtool_dispatch_reaches_the_host_and_the_parent_is_not_idle(tmp_path: Path) -> None:
    dispatcher = SlowDispatcher(delay=6.0)
    command = (
        "python3 -m kagura_agent.brain.memtool dispatch 'sum up' --name summary"
        " --step 'echo hi > hi.txt' --egress pypi --context mem-a"
    )

    async def scenario() -> None:
        limits = ChannelLimits(idle_seconds=2.0)
        async with attached(limits=limits, dispatcher=dispatcher) as (channel, _):
            events = await collect(channel, Turn(steps=(command,), cwd=str(tmp_path)))
            assert isinstance(events[-1], DoneEvent), events[-1]
            [result] = [e for e in events if isinstance(e, ToolResultEvent)]
            assert json.loads(result.output) == {
                "outcome": "success",
                "task": "summary",
                "output_memory": "mem-1",
            }

    asyncio.run(scenario())
    assert dispatcher.requests == [
        {
            "prompt": "sum up",
            "name": "summary",
            "steps": ["echo hi > hi.txt"],
            "egress": ["pypi"],
            "context": ["mem-a"],
            "notes": [],
            "verify": [],
        }
    ]


def test_a_run_without_a_dispatcher_says_so(tmp_path: Path) -> None:
    command = "python3 -m kagura_agent.brain.memtool dispatch 'x'; echo exit=$?"

    async def scenario() -> None:
        async with attached() as (channel, _):
            events = await collect(channel, Turn(steps=(command,), cwd=str(tmp_path)))
            [result] = [e for e in events if isinstance(e, ToolResultEvent)]
            assert "this run cannot dispatch sub-agents" in result.output
            assert "exit=1" in result.output

    asyncio.run(scenario())


@pytest.mark.parametrize("workdir", ["a/new", "a", "a/deeper/still", "file/x"])
def test_a_child_workdir_through_a_planted_symlink_makes_nothing_outside(
    tmp_path: Path, workdir: str
) -> None:
    """The parent's agent plants ``a -> OUTSIDE`` in its root and dispatches a child with
    workdir ``a/new``: the host (root, maybe) created OUTSIDE/new and chowned it to the
    root's owner before the child was planned and refused. Now nothing is made and the
    child is refused, every symlink or file in the way named."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "a").symlink_to(outside)
    (root / "file").write_text("x")
    with pytest.raises(Refused, match="is not a folder of the project"):
        make_workdir(str(root), workdir)
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in root.iterdir()) == ["a", "file"]


def test_a_child_workdir_is_made_inside_and_owned_like_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    made = make_workdir(str(root), "x/y")
    assert made == root / "x" / "y" and made.is_dir()
    assert os.stat(made).st_uid == os.stat(root).st_uid
    assert make_workdir(str(root), "x/y") == made  # an existing folder is reused
