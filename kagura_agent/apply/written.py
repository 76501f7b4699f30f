"""Was a file the host is about to trust written while an agent could write it? The
answer is read from run history, below apply: state/history.py. Kept here for apply's
modules until apply/ is laid out in role folders."""

from __future__ import annotations

from collections.abc import Iterable

from kagura_agent.state import history
from kagura_agent.state.choose import state_location
from kagura_agent.state.history import Written, hint, written_during_runs
from kagura_agent.state.store import Location


def refuse_written(
    what: str,
    paths: Iterable[str],
    where: Location | None = None,
    *,
    plan_file: str | None = None,
) -> None:
    """``history.refuse_written`` on the store at ``where``, the configured one by default."""
    location = state_location() if where is None else where
    history.refuse_written(what, paths, location, plan_file=plan_file)


__all__ = ["Written", "hint", "refuse_written", "written_during_runs"]
