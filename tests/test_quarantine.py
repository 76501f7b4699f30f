"""A project root the aftercare walk cannot finish is quarantined (apply/quarantine.py):
after ``kill -9`` the next apply's sweep of dead runs does it, loudly (red lines that say
what it means and the command that lifts it), never as a quiet note; apply then refuses
the root until ``kagura-agent aftercare ROOT`` has checked it to the end."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from apply_helpers import plan_for_root

from kagura_agent.apply.quarantine import lift, refuse_quarantined
from kagura_agent.apply.runs import open_run, sweep_dead_runs
from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError
from kagura_agent.state import StateStore


class _NoContainers:
    def list(self, labels: dict[str, str]) -> list[str]:
        return []

    def remove(self, container_id: str, *, force: bool = False) -> None:
        raise AssertionError("nothing to remove")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "root"
    path.mkdir()
    path.chmod(0o755)
    yield path
    subprocess.run(["chattr", "-R", "-i", str(path)], check=False, capture_output=True)


def _immutable(path: Path, on: bool) -> None:
    """What not even root may chmod: the walk's change fails (EPERM)."""
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)


@pytest.mark.usefixtures("without_docker")
def test_after_kill_9_the_sweep_quarantines_a_root_it_cannot_finish(
    root: Path, tmp_path: Path, state_dir: Path
) -> None:
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    plan = plan_for_root(tmp_path, root)
    with StateStore() as store:
        open_run(store, plan, "run-dead", clock)
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    stuck = root / "Leak-5f3a9c2e7b1d"
    stuck.write_bytes(b"#!/bin/sh\n")
    stuck.chmod(0o4755)
    (root / "fine").write_bytes(b"")
    (root / "fine").chmod(0o4755)
    _immutable(stuck, True)
    said: list[tuple[str, str]] = []
    with StateStore() as store:
        swept = sweep_dead_runs(
            store,
            _NoContainers(),  # type: ignore[arg-type]
            clock,
            lambda line, colour: said.append((line, colour)),
        )
    assert swept == ["run-dead"]
    red = [line for line, colour in said if colour == "red"]
    real = root.resolve()
    assert red[0].startswith(
        f"QUARANTINED {real}: the aftercare could not check 1 entry (Operation not permitted: 1)"
    )
    assert red[1] == (
        "the root's mode is now 0700 (was 0755) and its access ACL is removed: no other user"
        " can enter it; apply refuses it until it is checked again"
    )
    assert red[2] == f"to check it again and lift this: kagura-agent aftercare {real}"
    assert all("Leak-" not in line for line, _ in said)  # the agent chose the names
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "fine").stat().st_mode) == 0o755  # the rest was cleared

    with StateStore() as store:
        with pytest.raises(RefusedError) as refused:
            refuse_quarantined(store, str(root))
        assert (
            refused.value.hint
            == f"check it again and lift the quarantine: kagura-agent aftercare {real}"
        )
        with pytest.raises(RefusedError, match="stays quarantined: still could not check 1 entry"):
            lift(store, str(root))
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        _immutable(stuck, False)
        lifted = lift(store, str(root))
        assert lifted.report.complete and lifted.mode == 0o755
        assert stat.S_IMODE(root.stat().st_mode) == 0o755
        assert stat.S_IMODE(stuck.stat().st_mode) == 0o755
        refuse_quarantined(store, str(root))  # lifted: no refusal
        with pytest.raises(RefusedError, match="is not quarantined"):
            lift(store, str(root))
