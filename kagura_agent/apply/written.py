"""Was a file the host is about to trust written while an agent could write it?

A saved plan names what it is re-planned from — its manifest folder and task file — so
whoever wrote the plan file chose the authority ``apply PLAN.json`` runs under. An agent
writes anything under its project root, for as long as its run lasts; after that nothing
of it survives (its containers are gone). The kernel's ctime of a file is set on every
change and cannot be set back by an unprivileged writer, so a file whose ctime falls
inside a run's window, under that run's project root, may be the agent's work:

    window = [the run's opening, its closing)       (still open: until now)

Both are the host clock when the runs row was opened and closed; the agent's container
starts well after the one and is gone before the other. (A row from before they were
recorded: whole seconds, from its ``setid_since`` floor to ``ended_at`` + 1 s.)

An input the run held read-only (its task file, ``.git``, the manifest folder) keeps its
ctime, so the operator's own layout passes; a change the operator makes after the run
ended is theirs.
"""

from __future__ import annotations

import math
import os
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kagura_agent.apply.runtable import MIGRATIONS
from kagura_agent.apply.setid import CTIME_SLACK
from kagura_agent.clock import parse_iso
from kagura_agent.errors import RefusedError
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.paths import under
from kagura_agent.state import Location, SchemaBehind, StateStore


@dataclass(frozen=True)
class Written:
    """``path`` changed while run ``run_id`` had it under its writable ``project_root``."""

    path: str
    run_id: str
    project_root: str
    followed: bool = True  # the change is the file ``path`` leads to (else ``path`` itself)

    def render(self) -> str:
        return f"{self.path} (changed while run {self.run_id} could write {self.project_root})"


def written_during_runs(store: StateStore, paths: Iterable[str]) -> list[Written]:
    """Each of ``paths`` (and where a symlink among them leads) that changed during a run
    recorded in ``store`` whose project root holds it; missing paths are skipped."""
    runs = [(row["run_id"], row["project_root"], *_window(row)) for row in _rows(store)]
    found: list[Written] = []
    for path in dict.fromkeys(paths):
        for where, ctime, followed in _ctimes(path):
            hit = next(
                (
                    Written(path, run_id, root, followed)
                    for run_id, root, start, end in runs
                    if under(where, root) and start <= ctime < end
                ),
                None,
            )
            if hit is not None:
                found.append(hit)
                break
    return found


# The runs schema version from which each column of the query exists (runtable.py).
_ROOTS_FROM, _WINDOWS_FROM = 3, 5


def _rows(store: StateStore) -> list[Any]:
    """The runs that recorded a project root. A read-only store (``plan``: it creates and
    migrates nothing) is read at whatever version it has; one from before roots were
    recorded has no run to show."""
    try:
        store.migrate("runs", MIGRATIONS)
        version = len(MIGRATIONS)
    except SchemaBehind as behind:
        version = behind.current
    if version < _ROOTS_FROM:
        return []
    windows = (
        "opened_ns, closed_ns"
        if version >= _WINDOWS_FROM
        else "NULL AS opened_ns, NULL AS closed_ns"
    )
    return list(
        store.conn.execute(
            f"SELECT run_id, project_root, setid_since, ended_at, {windows} FROM runs"
            " WHERE project_root IS NOT NULL AND setid_since IS NOT NULL"
        )
    )


def _window(row: Any) -> tuple[float, float]:
    """[start, end) of the time the run's agent could write its root, in seconds."""
    if row["opened_ns"] is not None:
        start = row["opened_ns"] / 1e9
    else:
        start = float(row["setid_since"] + CTIME_SLACK)  # int(time.time()) at opening
    if row["closed_ns"] is not None:
        end = row["closed_ns"] / 1e9
    elif row["ended_at"] is not None:
        # ended_at is whole seconds (clock.iso): the run really ended within the next one.
        end = parse_iso(row["ended_at"]).timestamp() + 1
    else:
        end = math.inf
    return start, end


def _ctimes(path: str) -> list[tuple[str, float, bool]]:
    """(absolute path, ctime, followed) of ``path`` itself (a symlink is a change too) and
    of the file it resolves to."""
    found = []
    for where, follow in ((os.path.abspath(path), False), (os.path.realpath(path), True)):
        try:
            info = os.stat(where) if follow else os.lstat(where)
        except OSError:
            continue
        # Not a symlink: the file itself, as ``touch`` (following) reaches it.
        found.append((where, info.st_ctime, follow or not stat.S_ISLNK(info.st_mode)))
    return found


def hint(found: list[Written], plan_file: str | None = None) -> str:
    """What makes the next command pass, followed as written: a file is the operator's
    again once it changes after the run (its change time is what is judged), so review
    them and touch them (``-h``: a symlink itself, when the link is what changed); or
    keep what the host trusts outside project roots."""
    if plan_file is not None and any(w.path == plan_file for w in found):
        # A plan file is JSON no one reviews by eye: made again, it is the operator's.
        return (
            f"make the plan again now and review it (`kagura-agent plan -o {shlex.quote(plan_file)}"
            " TASK`), then apply that"
        )
    touched = [w for w in found if w.followed]
    links = [w for w in found if not w.followed]
    commands = [
        f"touch {flag}{' '.join(shlex.quote(w.path) for w in group)}"
        for flag, group in (("", touched), ("-h ", links))
        if group
    ]
    return (
        f"review {', '.join(w.path for w in found)}; if yours, `{' && '.join(commands)}`"
        " (a change after the run is the operator's) and run this again, or keep them"
        " outside every project root"
    )


def refuse_written(
    what: str,
    paths: Iterable[str],
    where: Location | None = None,
    *,
    plan_file: str | None = None,
) -> None:
    """RefusedError (exit 6) naming the first of ``paths`` a run could have written, by
    the run history of the store at ``where`` (the configured one by default);
    ``plan_file``: the saved plan among ``paths`` (its fix is another)."""
    store = StateStore.read_only(where)
    if store is None:
        return  # no store yet: no run was ever recorded
    with store:
        found = written_during_runs(store, [p for p in paths if p])
    if found:
        raise RefusedError(
            f"{what} may be an agent's, not the operator's: "
            + "; ".join(w.render() for w in found[:3]),
            hint=hint(found, plan_file),
        )


def layer_paths(catalog: Catalog) -> list[str]:
    """Every manifest folder of ``catalog`` and every file read as part of one."""
    paths: list[str] = []
    for info in catalog.layers:
        paths += [str(info["path"]), *info["reads"]]
    return paths
