"""The project root after a run: one function for a run's own end and for the sweep of a
dead run, and the operator's check again of a quarantined root.

Once the run's last container is gone, in this order:

1. the setid walk (setid.py): setuid/setgid bits, write for others, ACL entries granting
   others, on every entry the run changed, to any depth;
2. a repository planted at the top of the root, then at each submodule path
   (gitlinks.py): the operator's next ``git status`` would run its configuration;
3. what the operator's git hooks would run (hookcheck.py).

Each reports what it could not check. Any such entry — an entry the walk could not reach
or change, a submodule or hook input it could not look at — may still hold what the run
left, so the root is quarantined (quarantine.py) and the run fails, loudly; never a note.
"""

from __future__ import annotations

from dataclasses import dataclass

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.gitlinks import (
    PLANTED_REPOSITORY,
    Snapshot,
    check_gitlinks,
    check_root_repository,
    snapshot,
)
from kagura_agent.apply.aftercare.hookcheck import HookSnapshot, check_hooks
from kagura_agent.apply.aftercare.hookcheck import snapshot as hook_snapshot
from kagura_agent.apply.aftercare.quarantine import (
    Quarantine,
    quarantine,
    quarantined_since,
    release,
)
from kagura_agent.apply.aftercare.setid import SetidReport, clear_setid
from kagura_agent.apply.records.progress import RootFinding, Severity
from kagura_agent.clock import Clock
from kagura_agent.errors import RefusedError
from kagura_agent.hygiene import neutralise
from kagura_agent.state import StateStore


@dataclass(frozen=True)
class RootBefore:
    """The project root as the run found it, what its aftercare compares against: its
    ACL, its git links and the operator's hooks (a dead run swept later has its ACL only,
    from its row: judged by ctime alone)."""

    acl: str | None
    gitlinks: Snapshot | None = None
    hooks: HookSnapshot | None = None

    @classmethod
    def take(cls, root: str) -> RootBefore:
        return cls(acl.snapshot(root), snapshot(root), hook_snapshot(root))


@dataclass(frozen=True)
class Care:
    """What the aftercare of one root came to."""

    findings: tuple[RootFinding, ...]  # for the run's view (a dead run's: the sweep's)
    moved_aside: tuple[dict[str, str], ...]  # path, to, why (relative to the root)
    quarantined: Quarantine | None = None

    @property
    def failed(self) -> str | None:
        """Why the run failed (its root is quarantined), for its result."""
        if self.quarantined is None:
            return None
        return f"aftercare: project root quarantined ({self.quarantined.reasons})"


@dataclass(frozen=True)
class _Checked:
    walk: SetidReport
    findings: tuple[RootFinding, ...]
    moved: tuple[dict[str, str], ...]
    unchecked: tuple[tuple[str, int], ...]  # what could not be checked: (what, how many)
    problems: tuple[str, ...]  # the same, by name (the agent's names: shown to the operator)


def tend(
    store: StateStore,
    root: str,
    run_id: str,
    since: int,
    clock: Clock,
    *,
    before: RootBefore,
    withhold_names: bool = False,
) -> Care:
    """The aftercare of ``root`` for run ``run_id`` (changes at or after ``since``),
    against the root as the run found it; ``withhold_names``: a dead run's (its redactor
    died with it)."""
    checked = _check(
        root, since, before.acl, before.gitlinks, before.hooks, withhold_names, bounded=True
    )
    if not checked.unchecked:
        return Care(checked.findings, checked.moved)
    reasons = "; ".join(f"{what}: {n}" for what, n in checked.unchecked)
    count = sum(n for _, n in checked.unchecked)
    closed = quarantine(store, root, run_id, since, count, reasons, clock)
    loud = tuple(RootFinding(line, Severity.PROBLEM) for line in closed.lines())
    return Care(checked.findings + loud, checked.moved, closed)


def check_again(store: StateStore, root: str) -> tuple[SetidReport, int | None]:
    """The operator's ``kagura-agent aftercare ROOT``: every check again, from the
    quarantining run's start, the walk with no bound on entries or time; when nothing is
    left unchecked the root gets its mode and ACL back and the quarantine goes. Returns the
    walk and the mode given back; RefusedError naming what still could not be checked."""
    since, root_acl = quarantined_since(store, root)
    checked = _check(root, since, root_acl, None, None, False, bounded=False)
    if checked.unchecked:
        real = neutralise(root, newlines=False)
        raise RefusedError(
            f"{real} stays quarantined: still could not check"
            f" {sum(n for _, n in checked.unchecked)} entries: "
            + ", ".join(neutralise(p, newlines=False) for p in checked.problems[:5]),
            hint="fix or remove those entries (as the root's owner or root), then run"
            f" kagura-agent aftercare {real} again",
        )
    return checked.walk, release(store, root)


def _check(
    root: str,
    since: int,
    root_acl: str | None,
    gitlinks: Snapshot | None,
    hooks: HookSnapshot | None,
    withhold_names: bool,
    *,
    bounded: bool,
) -> _Checked:
    walk = (
        clear_setid(root, since, root_acl=root_acl)
        if bounded
        else clear_setid(root, since, root_acl=root_acl, max_entries=None, max_seconds=None)
    )
    repaired = Severity.WARNING  # what the checks repaired or moved aside
    findings = [RootFinding(line, repaired) for line in walk.summary(withhold_names=withhold_names)]
    unchecked = list(walk.why)
    problems = list(walk.problems.shown)
    moved: list[dict[str, str]] = []
    # The root first: git looking for the gitlinks would find a repository planted there.
    for check in (check_root_repository, check_gitlinks):
        planted = check(root, since, gitlinks)
        findings += [
            RootFinding(line, repaired) for line in planted.summary(withhold_names=withhold_names)
        ]
        moved += [{"path": rel, "to": to, "why": PLANTED_REPOSITORY} for rel, to in planted.moved]
        if planted.problems:
            unchecked.append(("a submodule or the root's repository", len(planted.problems)))
            problems += planted.problems
    hooked = check_hooks(root, since, hooks)
    # What the operator's hooks would have run: a problem, whatever was done about it.
    findings += [
        RootFinding(line, Severity.PROBLEM)
        for line in hooked.summary(withhold_names=withhold_names)
    ]
    moved += hooked.to_json()
    if hooked.problems:
        unchecked.append(("an input of the git hooks", len(hooked.problems)))
        problems += hooked.problems
    return _Checked(walk, tuple(findings), tuple(moved), tuple(unchecked), tuple(problems))
