"""A project root the aftercare could not check to the end: closed to every other user
until the operator has it checked again.

The aftercare (root.py) must reach every entry of the root and undo what a run must
not leave there (setuid/setgid bits, write for others, ACL entries granting others, a
planted repository, what the git hooks would run). When it cannot — the walk's bound of
entries or time reached, an I/O error, a directory it may not enter, the tree moved under
it, a submodule it could not move aside — something the run left may remain, reachable by
any local user. Then the root is quarantined, on the host:

- the project root directory itself (nothing below it) loses every permission for group
  and others (setgid and sticky kept) and its access ACL: no other local user can enter
  it, so none can run a setuid file or write a world-writable one anywhere beneath it;
- the state store records the quarantine (table ``quarantines``): the root, the run, that
  run's ctime bound, and the mode and access ACL the root had;
- the run is failed (apply's result, the sweep's note), in red, with what to do;
- apply refuses a quarantined root (exit 6) until it is lifted.

Lifting it is the operator's ``kagura-agent aftercare ROOT`` (aftercare.check_again):
the same aftercare from the same run's start, the walk with no bound on entries or time.
When nothing is left unchecked, the root gets back the mode and access ACL it had
(``release``) and the record goes; else it names what it could not check (fix or remove
those, then run it again).

Residue: a process of another user that already had its working directory, or a
directory open, below the root keeps that access (a directory's mode is checked on path
lookup only). The record is in the state store that recorded the run: an apply with
another state directory does not refuse the root (its mode still keeps others out).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.treewalk import open_root
from kagura_agent.clock import Clock, iso
from kagura_agent.errors import RefusedError
from kagura_agent.hygiene import neutralise
from kagura_agent.state import StateStore
from kagura_agent.state.history import MIGRATIONS as RUNS_MIGRATIONS

MIGRATIONS = [
    """
    CREATE TABLE quarantines (
        project_root TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        since BIGINT NOT NULL,
        quarantined_at TEXT NOT NULL,
        mode INTEGER NOT NULL,
        access_acl TEXT,
        unreached INTEGER NOT NULL,
        reasons TEXT NOT NULL
    );
    """
]

_KEPT_BITS = 0o700 | stat.S_ISGID | stat.S_ISVTX  # what a quarantined root keeps


@dataclass(frozen=True)
class Quarantine:
    """What ``quarantine`` did to a root (``closed``: its mode and ACL were changed)."""

    root: str
    unreached: int
    reasons: str
    mode_before: int | None
    closed: bool
    problem: str | None = None

    def lines(self) -> list[str]:
        """The loud lines: what happened, what it means, how to recover."""
        root = neutralise(self.root, newlines=False)
        first = (
            f"QUARANTINED {root}: the aftercare could not check {_entries(self.unreached)}"
            f" ({self.reasons}); what the run left there (a setuid file, write for"
            " others, an ACL, a planted repository) may remain. The run is failed."
        )
        if self.closed and self.mode_before is not None:
            second = (
                f"the root's mode is now {self.mode_before & _KEPT_BITS:04o} (was"
                f" {self.mode_before:04o}) and its access ACL is removed: no other user can"
                " enter it; apply refuses it until it is checked again"
            )
        else:
            second = (
                f"the root could NOT be closed to other users ({self.problem}): close it"
                f" yourself (chmod go-rwx {root}); apply refuses it until it is checked again"
            )
        return [first, second, f"to check it again and lift this: kagura-agent aftercare {root}"]


def quarantine(
    store: StateStore,
    root: str,
    run_id: str,
    since: int,
    unreached: int,
    reasons: str,
    clock: Clock,
) -> Quarantine:
    """Close ``root`` to other users and record it: its aftercare left ``unreached``
    entries unchecked (``reasons``: why, counted, in the aftercare's own words)."""
    store.migrate("quarantine", MIGRATIONS)
    real = os.path.realpath(root)
    mode, access, problem = None, None, None
    try:
        fd, added = open_root(real)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    else:
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode) & ~added
            access = _access_acl(fd)
            if access is not None:
                os.removexattr(f"/proc/self/fd/{fd}", acl.ACCESS)
            os.fchmod(fd, mode & _KEPT_BITS)
        except OSError as exc:
            problem = exc.strerror or str(exc)
        finally:
            os.close(fd)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO quarantines(project_root, run_id, since, quarantined_at, mode,"
            " access_acl, unreached, reasons) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (project_root) DO NOTHING",
            (
                real,
                run_id,
                int(since),
                iso(clock.now()),
                -1 if mode is None else mode,
                access,
                unreached,
                reasons,
            ),
        )
    return Quarantine(real, unreached, reasons, mode, problem is None, problem)


def refuse_quarantined(store: StateStore, root: str) -> None:
    """Apply's check: a quarantined root runs nothing until it is lifted (exit 6)."""
    store.migrate("quarantine", MIGRATIONS)
    real = os.path.realpath(root)
    row = store.conn.execute(
        "SELECT run_id, quarantined_at, unreached, reasons FROM quarantines WHERE project_root = ?",
        (real,),
    ).fetchone()
    if row is None:
        return
    shown = neutralise(real, newlines=False)
    raise RefusedError(
        f"project root {shown} is quarantined since {row['quarantined_at']}: the aftercare"
        f" of run {row['run_id']} could not check {_entries(row['unreached'])}"
        f" ({row['reasons']})",
        hint=f"check it again and lift the quarantine: kagura-agent aftercare {shown}",
    )


def quarantined_since(store: StateStore, root: str) -> tuple[int, str | None]:
    """The quarantining run's ctime bound and the ACLs recorded when it opened;
    RefusedError when ``root`` is not quarantined in this state store."""
    store.migrate("runs", RUNS_MIGRATIONS)
    store.migrate("quarantine", MIGRATIONS)
    real = os.path.realpath(root)
    row = store.conn.execute(
        "SELECT q.since, r.root_acl FROM quarantines q"
        " LEFT JOIN runs r ON r.run_id = q.run_id WHERE q.project_root = ?",
        (real,),
    ).fetchone()
    if row is None:
        raise RefusedError(
            f"project root {neutralise(real, newlines=False)} is not quarantined in this"
            " state store",
            hint="pass the root apply named (kagura-agent aftercare PATH), with the same"
            " KAGURA_AGENT_STATE_DIR as that apply",
        )
    return int(row["since"]), row["root_acl"]


def release(store: StateStore, root: str) -> int | None:
    """Checked to the end: the root gets back the mode and access ACL it had and the
    record goes. Returns the mode given back (None when it was not known)."""
    real = os.path.realpath(root)
    row = store.conn.execute(
        "SELECT mode, access_acl FROM quarantines WHERE project_root = ?", (real,)
    ).fetchone()
    if row is None:
        return None
    mode = int(row["mode"])
    try:
        _give_back(real, mode, row["access_acl"])
    except OSError as exc:
        raise RefusedError(
            f"{neutralise(real, newlines=False)} was checked to the end, but its mode could"
            f" not be given back: {exc.strerror}",
            hint="run this as the root's owner or as root (it stays quarantined)",
        ) from exc
    with store.transaction() as conn:
        conn.execute("DELETE FROM quarantines WHERE project_root = ?", (real,))
    return mode if mode >= 0 else None


def _give_back(root: str, mode: int, access: str | None) -> None:
    fd, _ = open_root(root)
    try:
        if mode >= 0:
            os.fchmod(fd, mode)
        if access is not None:
            os.setxattr(f"/proc/self/fd/{fd}", acl.ACCESS, bytes.fromhex(access))
    finally:
        os.close(fd)


def _access_acl(fd: int) -> str | None:
    try:
        return os.getxattr(f"/proc/self/fd/{fd}", acl.ACCESS).hex()
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"
