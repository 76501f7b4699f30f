"""Runs in the state store, the apply lock, and clean-up of runs a crash left behind.

Every apply writes a ``runs`` row (owner pid and start time) before it creates anything,
so the next start can tell a live run from one whose process was killed, and remove the
containers of the dead one. The locks are ``flock``s — on the project root directory
itself and on a file per session — so the kernel drops them when the process dies and a
crash never leaves one held.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kagura_agent.apply.aftercare.root import RootBefore, tend
from kagura_agent.apply.aftercare.setid import ctime_floor
from kagura_agent.apply.guards.parentdeath import PARENT_ENV, PARENT_ROOT_ENV
from kagura_agent.apply.records.progress import RootFinding
from kagura_agent.apply.run.context import ApplyRuntime
from kagura_agent.clock import Clock, iso
from kagura_agent.errors import RefusedError
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.paths import state_dir
from kagura_agent.plan.model import Plan
from kagura_agent.processes import owner_alive, process_start, this_host
from kagura_agent.state import StateStore
from kagura_agent.state.history import MIGRATIONS


def new_run_id() -> str:
    return "run-" + secrets.token_hex(6)


def open_run(
    store: StateStore, plan: Plan, run_id: str, clock: Clock, *, root_acl: str | None = None
) -> int:
    """Record the run as open; returns the ctime bound of its setuid/setgid check.
    ``root_acl``: the project root's ACLs now (acl.snapshot), kept by the check."""
    store.migrate("runs", MIGRATIONS)
    since = ctime_floor()
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO runs(run_id, task, session, fingerprint, pid, pid_start, started_at,"
            " host, project_root, setid_since, opened_ns, root_acl, kind, budget)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                plan["task"]["name"],
                plan["task"]["session"],
                plan["fingerprint"],
                os.getpid(),
                process_start(os.getpid()),
                iso(clock.now()),
                this_host(),
                os.path.realpath(plan["task"]["project_root"]),
                since,
                time.time_ns(),
                root_acl,
                plan["task"]["kind"],
                json.dumps(_budget(plan)),
            ),
        )
    return since


def _budget(plan: Plan) -> dict[str, Any]:
    """What the runs table keeps of the plan's budget: the limits and their forecast."""
    budget = plan["budget"]
    return {
        "turns": budget["turns"],
        "cost_usd": budget["cost_usd"],
        "wall_seconds": budget["wall_seconds"],
        "forecast": budget["forecast"],
    }


def close_run(
    store: StateStore,
    run_id: str,
    outcome: str,
    exit_code: int,
    clock: Clock,
    *,
    turns: int | None = None,
    model_calls: int | None = None,
    cost_usd: float | None = None,
) -> None:
    with store.transaction() as conn:
        conn.execute(
            "UPDATE runs SET ended_at = ?, outcome = ?, exit_code = ?, turns = ?,"
            " model_calls = ?, cost_usd = ?, closed_ns = ? WHERE run_id = ?",
            (
                iso(clock.now()),
                outcome,
                exit_code,
                turns,
                model_calls,
                cost_usd,
                time.time_ns(),
                run_id,
            ),
        )


def sweep_dead_runs(
    store: StateStore,
    runtime: ApplyRuntime,
    clock: Clock,
    on_event: Callable[[RootFinding], None] | None = None,
    before_removal: Callable[[], object] | None = None,
) -> list[str]:
    """Remove the containers of runs whose applying process died, then clear what setuid
    and setgid bits and world-write they left in their project roots, and move aside the
    git repositories they planted there (``on_event`` gets what the aftercare found: a
    problem for a root quarantined because its walk could not check every entry,
    apply/aftercare/quarantine.py); close their rows. Runs of another host are left to that
    host (its containers are on
    its daemon, its roots on its disks). ``before_removal`` is called once, before the
    first dead run's containers go: the egress sweep, which salvages a dead proxy's log
    before it removes the proxy (its container carries the run's label too)."""
    store.migrate("runs", MIGRATIONS)
    swept = []
    rows = store.conn.execute(
        "SELECT run_id, pid, pid_start, host, project_root, setid_since, root_acl FROM runs"
        " WHERE ended_at IS NULL"
    ).fetchall()
    for row in rows:
        if owner_alive(row["pid"], row["pid_start"], row["host"]):
            continue
        if before_removal is not None:
            before_removal()
            before_removal = None
        for container_id in runtime.list({LABEL_RUN: row["run_id"]}):
            runtime.remove(container_id, force=True)
        # Only once its containers are gone: nothing can set a bit again behind the walk.
        if row["project_root"] is not None and row["setid_since"] is not None:
            # No snapshot: judged by ctime alone; the agent chose the names, and the run's
            # redactor died with it (counts only).
            care = tend(
                store,
                row["project_root"],
                row["run_id"],
                row["setid_since"],
                clock,
                before=RootBefore(row["root_acl"]),
                withhold_names=True,
            )
            if on_event is not None:
                for finding in care.findings:
                    on_event(finding)
        close_run(store, row["run_id"], "crashed", -1, clock)
        swept.append(row["run_id"])
    return swept


@contextmanager
def apply_lock(plan: Plan) -> Iterator[None]:
    """Hold the project-root lock (and the session lock) for the duration of a run.

    The project-root lock is an ``flock`` on the root directory itself (its real path), so
    it holds across state directories and users: whoever can apply to the root can open
    it, and the kernel sees one inode whatever path or state directory led there. The
    session lock is a file in the state directory (sessions live there).
    """
    root = os.path.realpath(plan["task"]["project_root"])
    handles: list[Any] = []
    try:
        handles += root_locks(root)
        session = plan["task"]["session"]
        if session:
            handles.append(_lock_file("session", session))
        yield
    finally:
        for handle in handles:
            if isinstance(handle, int):
                os.close(handle)
            else:
                handle.close()


def root_locks(root: str, environ: Mapping[str, str] = os.environ) -> list[int]:
    """Lock ``root`` exclusively and every folder above it shared; the descriptors held.

    One run's agent writes anything under its root, so a run whose root lies inside a
    live run's root is no run of its own: the outer agent could rewrite its files while
    it works, forge the evidence its verify reads, or plant what its host checks trust.
    The shared locks make the nesting exclusive both ways (an outer root's exclusive lock
    and an inner run's shared lock on it conflict) while siblings under one folder, which
    only share locks, run side by side. A folder that cannot be opened is not locked.
    A dispatched child is the exception its parent names (``PARENT_ROOT_ENV``, with the
    roots of the parent's own dispatching ancestors): its root lies inside theirs on
    purpose, and they wait for it.
    """
    held = [_lock_root(root)]
    named = environ.get(PARENT_ROOT_ENV, "") if environ.get(PARENT_ENV) else ""
    parents = {os.path.realpath(r) for r in named.split(os.pathsep) if r}
    try:
        folder = os.path.dirname(root)
        while True:
            if folder not in parents:
                fd = _lock_ancestor(folder, root)
                if fd is not None:
                    held.append(fd)
            if folder == os.path.dirname(folder):
                break
            folder = os.path.dirname(folder)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held


def _lock_ancestor(folder: str, root: str) -> int | None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise RefusedError(
            f"project root {root} is inside {folder}, which another process is applying to:"
            " that run's agent can write anywhere in it, this run's files too",
            hint="wait for that run to finish, or give this task a root outside it",
        ) from exc
    except OSError:  # a file system without flock (ENOLCK): that folder is not locked
        os.close(fd)
        return None
    return fd


def _lock_root(root: str) -> int:
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise RefusedError(f"cannot lock the project root {root}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise RefusedError(
            f"project root {root} is already being applied by another process, or holds"
            " the project root of a run in progress (the lock is on the directory itself:"
            " any state directory, any user)",
            hint="wait for that run to finish, or stop it",
        ) from exc
    return fd


def _lock_file(what: str, value: str) -> Any:
    folder = state_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(value.encode()).hexdigest()[:24]
    handle = open(folder / f"{digest}.lock", "a+", encoding="utf-8")  # noqa: SIM115 - held
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RefusedError(
            f"{what} {value} is already being applied ({holder})",
            hint="wait for that run to finish, or stop it",
        ) from exc
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle
