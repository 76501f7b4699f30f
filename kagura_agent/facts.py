"""Facts: read-only look-ups gathered before planning, so the planner stays pure.

A Facts value can be written to and read from JSON (golden plan tests keep theirs in
``facts.json``). ``gather_facts`` is the only function here that touches the world.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kagura_agent.agentgit.base import git_base
from kagura_agent.clock import SystemClock
from kagura_agent.errors import UsageError
from kagura_agent.graduation.ledger import snapshot
from kagura_agent.graduation.model import GraduationSnapshot
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.inputfile import Unreadable, read_bytes
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.proxyimage import proxy_image
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.membrane.images import (
    daemon_info,
    inspect_image,
    recipe_digest,
    recipe_path,
    repo_digest,
    software_of,
)
from kagura_agent.membrane.isolation import isolation_report
from kagura_agent.memory.factory import section_from_manifest
from kagura_agent.memory.model import MemoryStore
from kagura_agent.memory.postgres import PgMemoryStore
from kagura_agent.memory.sqlite import SqliteMemoryStore
from kagura_agent.paths import sqlite_path
from kagura_agent.patterns.checkpoint import (
    Checkpoint,
    load_checkpoint,
    session_fact,
    session_owner,
)
from kagura_agent.patterns.cost_history import history
from kagura_agent.patterns.failure_learning import known_failures
from kagura_agent.patterns.transcripts import transcript_info
from kagura_agent.plan.history import last_applied
from kagura_agent.state import (
    Location,
    SchemaBehind,
    StateDbError,
    StateStore,
    open_store_read_only,
    state_location,
)

# A facts file is a few KiB of JSON written by a test or a script.
MAX_FACTS_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Facts:
    image_digests: dict[str, str | None] = field(default_factory=dict)
    # tag -> ``repository@sha256:…`` it was pushed to or pulled from (Image.spec.repository)
    image_pulls: dict[str, str | None] = field(default_factory=dict)
    recipe_digests: dict[str, str | None] = field(default_factory=dict)
    # tag -> the brain software the image's label names (images.software_of)
    image_software: dict[str, dict[str, str]] = field(default_factory=dict)
    graduation: GraduationSnapshot = field(default_factory=lambda: GraduationSnapshot(version=0))
    known_failures: list[dict[str, Any]] = field(default_factory=list)
    cost_history: dict[str, Any] | None = None
    untrusted_inputs: list[str] = field(default_factory=list)
    daemon: dict[str, Any] | None = None
    project_owner: list[int] | None = None  # [uid, gid] of the project root
    project_mode: int | None = None  # its permission bits (None: not looked up)
    # A dispatched child (task.parent): the parent's last applied plan and its run.
    parent_plan: dict[str, Any] | None = None
    parent_run: str | None = None
    missing_memories: list[str] = field(default_factory=list)  # context ids not in the store
    # State the read-only look-ups could not read (an older schema): the plan warns.
    state_notes: list[str] = field(default_factory=list)
    # A named session's checkpoint (patterns/checkpoint.session_fact): where it stands
    # and what it spent; None without a session, a checkpoint, or one of this task's.
    checkpoint: dict[str, Any] | None = None
    # A task asking for its commits as a branch: the operator's HEAD (agentgit/base.py).
    git_base: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "image_digests": dict(self.image_digests),
            "image_pulls": dict(self.image_pulls),
            "recipe_digests": dict(self.recipe_digests),
            "image_software": {k: dict(v) for k, v in self.image_software.items()},
            "graduation": self.graduation.to_json(),
            "known_failures": list(self.known_failures),
            "cost_history": self.cost_history,
            "untrusted_inputs": list(self.untrusted_inputs),
            "daemon": self.daemon,
            "project_owner": self.project_owner,
            "project_mode": self.project_mode,
            "parent_plan": self.parent_plan,
            "parent_run": self.parent_run,
            "missing_memories": list(self.missing_memories),
            "state_notes": list(self.state_notes),
            "checkpoint": self.checkpoint,
            "git_base": self.git_base,
        }

    @classmethod
    def load(cls, path: str) -> Facts:
        """Facts fixed in a JSON file (``plan --facts``), instead of gathered."""
        try:
            raw = read_bytes(path, MAX_FACTS_BYTES)
        except Unreadable as exc:
            if exc.too_big:
                raise UsageError(
                    f"facts file {path} is larger than {MAX_FACTS_BYTES // 2**20} MiB"
                ) from None
            raise UsageError(f"cannot read facts file {path}: {exc.reason}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError too
            raise UsageError(f"cannot read facts file {path}: {exc}") from exc
        except RecursionError:
            raise UsageError(f"facts file {path} is nested too deeply") from None
        if not isinstance(data, dict):
            raise UsageError(f"facts file {path} must hold a JSON object")
        try:
            return cls.from_json(data)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise UsageError(
                f"facts file {path} has the wrong shape: {type(exc).__name__}: {exc}"
            ) from None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Facts:
        return cls(
            image_digests=dict(data.get("image_digests", {})),
            image_pulls=dict(data.get("image_pulls", {})),
            recipe_digests=dict(data.get("recipe_digests", {})),
            image_software={
                str(k): {str(n): str(v) for n, v in dict(versions).items()}
                for k, versions in dict(data.get("image_software", {})).items()
            },
            graduation=GraduationSnapshot.from_json(data.get("graduation", {})),
            known_failures=list(data.get("known_failures", [])),
            cost_history=data.get("cost_history"),
            untrusted_inputs=list(data.get("untrusted_inputs", [])),
            daemon=data.get("daemon"),
            project_owner=data.get("project_owner"),
            project_mode=data.get("project_mode"),
            parent_plan=data.get("parent_plan"),
            parent_run=data.get("parent_run"),
            missing_memories=list(data.get("missing_memories", [])),
            state_notes=list(data.get("state_notes", [])),
            checkpoint=data.get("checkpoint"),
            git_base=data.get("git_base"),
        )


def gather_facts(
    catalog: Catalog,
    task: ResolvedTask,
    pin: ImagePin | None = None,
    proxy_pin: ImagePin | None = None,
) -> Facts:
    """Look everything up that the planner needs; never fails on a missing resource.

    Read-only: the state store and the memory store are opened with
    ``StateStore.read_only`` (nothing created, nothing migrated; docs/architecture.md, State).
    ``pin`` is a saved plan's image: when that image ID is here, it is the image fact
    (apply runs the pinned image, whatever the tag points at now); ``proxy_pin`` is the
    same for its egress proxy image (``egress.proxy``).
    """
    tag = task.image.spec["tag"]
    image = _image_facts(tag, task.image.spec.get("repository"), pin)
    proxy = proxy_image(catalog)
    proxy_facts = (
        _image_facts(proxy.tag, proxy.repository, proxy_pin)
        if task.runtime == "container"
        else (None, None, {})
    )
    recipe = task.image.spec["recipe"]
    folder = recipe_path(recipe)
    found: dict[str, Any] = {}
    notes: list[str] = []
    for part in (
        _graduation(catalog),
        _memory_facts(task),
        _parent_facts(task),
        _session_facts(task),
    ):
        notes += part.pop("state_notes", [])
        found.update(part)
    return Facts(
        image_digests={tag: image[0], proxy.tag: proxy_facts[0]},
        image_pulls={tag: image[1], proxy.tag: proxy_facts[1]},
        recipe_digests={recipe: recipe_digest(folder) if folder is not None else None},
        image_software={tag: image[2]} if image[2] else {},
        project_owner=_owner(task.project_root),
        project_mode=_mode(task.project_root),
        daemon=_daemon(daemon_info()) if task.runtime == "container" else None,
        git_base=git_base(task.project_root).to_json() if task.commits == "branch" else None,
        state_notes=notes,
        **found,
    )


@dataclass(frozen=True)
class ImagePin:
    """The image a saved plan pins: its ID and where to pull it from (or None)."""

    digest: str
    pull: str | None


def _image_facts(
    tag: str, repository: str | None, pin: ImagePin | None
) -> tuple[str | None, str | None, dict[str, str]]:
    """(image ID, ``repository@sha256:…``, the software its label names) for ``tag``
    here — the pin's when it is here."""
    if pin is not None:
        pinned = inspect_image(pin.digest)
        if pinned is not None and pinned.get("Id") == pin.digest:
            return pin.digest, pin.pull, software_of(pinned)
    found = inspect_image(tag)
    if found is None:
        return None, None, {}
    pull = repo_digest(found, repository) if repository else None
    return str(found["Id"]), pull, software_of(found)


def _daemon(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the plan shows: whether container root is host root, runtimes, version."""
    if info is None:
        return None
    report = isolation_report(info)
    return {
        "userns_remap": report["userns_remap"],
        "rootless": report["rootless"],
        "runtimes": report["runtimes"],
        "version": info.get("ServerVersion"),
    }


def _owner(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_uid, info.st_gid]


def _mode(path: str) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def _graduation(catalog: Catalog) -> dict[str, Any]:
    """The graduation snapshot; an absent or older graduation schema is "nothing
    graduated yet" (fail closed), with a note when there was state it could not read."""

    knobs = graduation_settings(catalog).knobs
    store = open_store_read_only()
    if store is None:
        return {"graduation": GraduationSnapshot(version=0, knobs=knobs)}
    with store:
        try:
            return {"graduation": snapshot(store, knobs)}
        except SchemaBehind as exc:
            empty = GraduationSnapshot(version=0, knobs=knobs)
            if exc.current == 0:
                return {"graduation": empty}
            return {
                "graduation": empty,
                "state_notes": [f"{exc.message}: nothing counts as graduated"],
            }


def _memory_facts(task: ResolvedTask) -> dict[str, Any]:
    """Known failures, cost history and untrusted context from the memory store (the
    embedded file, or the team's in the PostgreSQL state store), if any."""
    section = _memory_section(task)
    location: Location
    if section["backend"] == "sqlite":
        location = sqlite_path(section)
    elif section["backend"] == "postgres" and isinstance(state_location(), str):
        location = state_location()  # the team's memory, in the state store's database
    else:
        return {}
    state = StateStore.read_only(location)
    if state is None:
        return {}
    try:
        store: MemoryStore = (
            SqliteMemoryStore(location, state=state)
            if isinstance(location, Path)
            else PgMemoryStore(location, state=state)
        )
    except SchemaBehind as exc:
        state.close()
        if exc.current == 0:
            return {}
        # Fail closed: memories that cannot be read cannot be shown trusted.
        context = [
            *task.context.get("memories", []),
            *(task.parent["context"] if task.parent else []),
        ]
        return {
            "untrusted_inputs": [f"memory:{memory_id}" for memory_id in context],
            "state_notes": [
                f"{exc.message}: no known failures or cost history, context memories untrusted"
            ],
        }
    try:
        untrusted, missing = [], []
        parent_context = task.parent["context"] if task.parent else []
        for memory_id in [*task.context.get("memories", []), *parent_context]:
            found = store.get(memory_id)
            if found is None:
                missing.append(memory_id)
            elif found.untrusted:
                untrusted.append(f"memory:{memory_id}")
        return {
            "known_failures": known_failures(store, task.kind, now=SystemClock().now()),
            "cost_history": history(store, task.kind),
            "untrusted_inputs": untrusted,
            "missing_memories": missing,
        }
    finally:
        store.close()


def _parent_facts(task: ResolvedTask) -> dict[str, Any]:
    """For a dispatched child: the parent's last applied plan and the run that applied it."""
    if task.parent is None:
        return {}
    parent_plan = last_applied(task.parent["task"])
    if parent_plan is None:
        return {}
    return {"parent_plan": parent_plan, "parent_run": _applying_run(parent_plan)}


def _session_facts(task: ResolvedTask) -> dict[str, Any]:
    """A named session's checkpoint, when this task may resume it (its owner's)."""
    if not task.session:
        return {}
    store = open_store_read_only()
    if store is None:
        return {}
    owner = session_owner(task.project_root, task.kind)
    with store:
        try:
            found = load_checkpoint(store, task.session)
        except SchemaBehind as exc:
            if exc.current == 0:
                return {}
            return {"state_notes": [f"{exc.message}: the session's spending is not known"]}
        except StateDbError:
            return {}
        if found is None or dict(found.owner) != owner:
            return {}  # none, or another task's (apply refuses to resume that)
        fact = session_fact(found)
        if found.brain_session_id:
            fact["conversation"] = {"bytes": _kept_bytes(store, found, owner)}
    return {"checkpoint": fact}


def _kept_bytes(store: StateStore, found: Checkpoint, owner: dict[str, str]) -> int | None:
    """How large the kept transcript of the checkpoint's brain conversation is (None: not
    kept; plan/conversation.py)."""
    try:
        kept = transcript_info(store, found.session, owner)
    except (SchemaBehind, StateDbError):
        return None
    return (
        kept.size if kept is not None and kept.brain_session_id == found.brain_session_id else None
    )


def _applying_run(plan: Mapping[str, Any]) -> str | None:
    """The newest run of ``plan`` (same task, same fingerprint) in the runs table."""
    # Read-only: planning must never create or migrate the state store.
    store = open_store_read_only()
    if store is None:
        return None
    with store:
        try:
            row = store.conn.execute(
                "SELECT run_id FROM runs WHERE task = ? AND fingerprint = ?"
                " ORDER BY started_at DESC LIMIT 1",
                (plan["task"]["name"], plan["fingerprint"]),
            ).fetchone()
        except StateDbError:
            return None
    return str(row[0]) if row else None


def _memory_section(task: ResolvedTask) -> dict[str, Any]:
    memory = task.memory
    return section_from_manifest(*((memory.name, memory.spec) if memory else (None, None)))
