"""Run history: the ``runs`` table (one row per apply) and what it says about files.

apply writes a row when a run opens and closes it when the run ends (apply/records/runs.py); this
module owns the table's schema and reads the history back. It sits below apply so that
whoever must judge a file by the runs — the planner, apply, the choice of the store
itself (state/choose.py) — reads it without importing apply.

Was a file the host is about to trust written while an agent could write it?

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

from kagura_agent.clock import parse_iso
from kagura_agent.errors import RefusedError
from kagura_agent.paths import under
from kagura_agent.state.store import Location, SchemaBehind, StateStore

# ctime comes from the kernel's coarse clock, which may lag time.time() slightly: a run's
# write window opens this many seconds before its row (apply/aftercare/setid.ctime_floor).
CTIME_SLACK = 2

# The ``runs`` table's schema, oldest first (StateStore.migrate).
MIGRATIONS = [
    """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        task TEXT NOT NULL,
        session TEXT,
        fingerprint TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_start TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        outcome TEXT,
        exit_code INTEGER
    );
    CREATE INDEX runs_open ON runs(ended_at);
    """,
    # The applying process's host (processes.this_host): a shared state store holds the runs
    # of many hosts, and only the host that ran one can remove its containers.
    "ALTER TABLE runs ADD COLUMN host TEXT",
    # The project root and the ctime bound of its setuid/setgid check (setid.py): a run
    # killed before its check gets it from the next apply's sweep.
    """
    ALTER TABLE runs ADD COLUMN project_root TEXT;
    ALTER TABLE runs ADD COLUMN setid_since BIGINT;
    """,
    # The turns the brain reported and the model calls the host counted at the proxy
    # (apply/guards/modelcalls.py; NULL when not counted): an operator sees where they differ.
    """
    ALTER TABLE runs ADD COLUMN turns INTEGER;
    ALTER TABLE runs ADD COLUMN model_calls INTEGER;
    """,
    # When the run could start writing its root, and when it could no longer (ns, host
    # clock): what it may have written is judged by ctime against them (below).
    """
    ALTER TABLE runs ADD COLUMN opened_ns BIGINT;
    ALTER TABLE runs ADD COLUMN closed_ns BIGINT;
    """,
    # The project root's POSIX ACLs at the start of the run (acl.snapshot; NULL: not
    # recorded): the walk after it keeps them (apply/aftercare/acl.py).
    "ALTER TABLE runs ADD COLUMN root_acl TEXT",
    # The task kind, the budget in force with the forecast it was learnt from (JSON: the
    # plan's budget turns, cost_usd, wall_seconds and forecast) and the dollars the brain
    # reported: the web console's runs list and cost chart read them. Runs are listed
    # newest first.
    """
    ALTER TABLE runs ADD COLUMN kind TEXT;
    ALTER TABLE runs ADD COLUMN budget TEXT;
    ALTER TABLE runs ADD COLUMN cost_usd REAL;
    CREATE INDEX runs_started ON runs(started_at);
    CREATE INDEX runs_kind ON runs(kind, started_at);
    """,
]


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


# The runs schema version from which each column of the query exists (MIGRATIONS above).
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
    where: Location,
    *,
    plan_file: str | None = None,
) -> None:
    """RefusedError (exit 6) naming the first of ``paths`` a run could have written, by
    the run history of the store at ``where``; ``plan_file``: the saved plan among
    ``paths`` (its fix is another)."""
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
