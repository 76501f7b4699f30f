"""The warm pool's files in the state directory: who holds each pooled session.

Plain files and rename(2), no Docker (pool.py has the lifecycle; the crash sweep reads
these to know which pooled objects something still answers for). See pool.py.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from kagura_agent import paths
from kagura_agent.membrane.egress import owner

LABEL_POOL = "dev.kagura.pool"  # the pooled session's name, on each of its objects
# The pool directory whose files answer for it: a sweep from any state directory on the
# host reads that pool's files (a run of one state directory is never swept by another's).
LABEL_POOL_DIR = "dev.kagura.pool-dir"
IDLE, CLAIMED, RETIRED = "idle", "claimed", "retired"


def pool_dir() -> Path:
    return paths.state_dir() / "egress-pool"


@dataclass(frozen=True)
class PooledSession:
    """One pooled session's Docker objects, as its pool file records them."""

    name: str
    proxy_id: str
    proxy_name: str
    volume: str
    network: str
    keeper: str  # owner.current_owner() of the keeper that made it
    created: float  # time.time()
    image: str
    run_id: str = ""  # set once claimed

    @classmethod
    def load(cls, path: Path) -> PooledSession | None:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (OSError, ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class Entry:
    """A pool file: its state, session name, claimer (claimed only) and path."""

    state: str
    name: str
    claimer: str
    path: Path

    def session(self) -> PooledSession | None:
        return PooledSession.load(self.path)


def write(path: Path, session: PooledSession) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(session), sort_keys=True))
    os.replace(tmp, path)


def entries(base: Path | None = None) -> list[Entry]:
    """Every pool file, oldest first within each state."""
    base = base or pool_dir()
    found: list[Entry] = []
    for state in (IDLE, CLAIMED, RETIRED):
        folder = base / state
        try:
            files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        except OSError:
            continue
        for path in files:
            stem = path.name[: -len(".json")]
            name, _, claimer = stem.partition("@")
            found.append(Entry(state, name, claimer, path))
    return found


def names_alive(
    base: Path | None = None, is_alive: Callable[[str], bool] = owner.owner_alive
) -> dict[str, bool]:
    """Pooled session name -> whether something still answers for it (see the module doc).

    Names with no pool file are absent: their objects go by their owner label alone.
    """
    alive: dict[str, bool] = {}
    for entry in entries(base):
        if entry.state == CLAIMED:
            alive[entry.name] = alive.get(entry.name, False) or is_alive(entry.claimer)
        else:
            session = entry.session()
            keeper = session.keeper if session else ""
            alive[entry.name] = alive.get(entry.name, False) or is_alive(keeper)
    return alive


def claimed_runs(base: Path | None = None) -> dict[str, str]:
    """Used session name -> the run id its claimer wrote (for a crash sweep's salvage)."""
    runs: dict[str, str] = {}
    for entry in entries(base):
        session = entry.session() if entry.state != IDLE else None
        if session is not None and session.run_id:
            runs[entry.name] = session.run_id
    return runs


def forget_dead(names: set[str], base: Path | None = None) -> None:
    """Drop the pool files of ``names`` (their objects were just swept)."""
    for entry in entries(base):
        if entry.name in names:
            forget(entry.path)


# --- the claiming side (apply) --------------------------------------------------------------


def claim(run_id: str, image: str, base: Path | None = None) -> tuple[PooledSession, Path] | None:
    """Take one idle session for ``run_id`` (atomically: one rename), or None.

    Only sessions of ``image`` (the egress proxy's current ref) made by a live keeper are
    taken; the rest are left to the keeper and the sweeps.
    """
    base = base or pool_dir()
    me = owner.current_owner()
    for entry in entries(base):
        if entry.state != IDLE:
            continue
        session = entry.session()
        if session is None or session.image != image or not owner.owner_alive(session.keeper):
            continue
        target = base / CLAIMED / f"{entry.name}@{me}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry.path, target)
        except FileNotFoundError:
            continue  # another run took it first
        claimed = PooledSession(**{**asdict(session), "run_id": run_id})
        write(target, claimed)
        return claimed, target
    return None


def retire(claimed_path: Path) -> bool:
    """Hand a used session to the keeper for removal; False when no keeper answers."""
    session = PooledSession.load(claimed_path)
    if session is None or not owner.owner_alive(session.keeper):
        return False
    name = claimed_path.name.partition("@")[0]
    target = claimed_path.parent.parent / RETIRED / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(claimed_path, target)
    except FileNotFoundError:
        return False
    return True


def forget(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
