"""What the operator's repository offers the agent's branch: the facts ``plan`` reads.

Gathered on the host before planning (facts.py), read-only: ``git rev-parse`` and
``symbolic-ref`` through manifest/gitinputs.host_git (no hooks, no fsmonitor, no GIT_*).
The project root must be the top of a git work tree whose ``.git`` is a folder (not the
file of a linked worktree or a submodule), with a commit at HEAD, whose objects are all
its own (no ``objects/info/alternates``, not shallow): the agent's repository borrows
exactly that folder's objects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kagura_agent.manifest.gitinputs import host_git


@dataclass(frozen=True)
class GitBase:
    """The commit the agent's repository is seeded from, or why there is none."""

    git_dir: str  # the operator's .git (real path)
    seed: str | None = None  # the commit at HEAD
    head: str | None = None  # the branch HEAD names (refs/heads/…), None when detached
    object_format: str = "sha1"
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "git_dir": self.git_dir,
            "seed": self.seed,
            "head": self.head,
            "object_format": self.object_format,
            "problem": self.problem,
        }


def git_base(root: str) -> GitBase:
    """The operator's HEAD in project root ``root`` (a real path), or the problem."""
    git_dir = os.path.join(root, ".git")
    if not os.path.lexists(git_dir):
        return GitBase(git_dir, problem=f"{root} is not a git work tree (no .git)")
    if os.path.islink(git_dir) or not os.path.isdir(git_dir):
        return GitBase(
            git_dir,
            problem=f"{git_dir} is not a folder (a linked worktree or a submodule's checkout)",
        )
    out = host_git(root, ["rev-parse", "--show-toplevel", "--show-object-format"])
    lines = os.fsdecode(out).splitlines() if out is not None else []
    if len(lines) != 2:
        return GitBase(git_dir, problem=f"git does not read {git_dir} as a repository")
    top, object_format = lines
    if os.path.realpath(top) != root:
        return GitBase(git_dir, problem=f"{root} is not the top of its git work tree ({top})")
    for name, why in (
        ("objects/info/alternates", "it borrows objects from another repository"),
        ("shallow", "it is a shallow clone (git fetch --unshallow first)"),
    ):
        if os.path.lexists(os.path.join(git_dir, name)):
            return GitBase(git_dir, object_format=object_format, problem=f"{git_dir}: {why}")
    seed = host_git(root, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
    if not seed:
        return GitBase(git_dir, object_format=object_format, problem="HEAD has no commit yet")
    head = host_git(root, ["symbolic-ref", "--quiet", "HEAD"])
    return GitBase(
        git_dir,
        seed=os.fsdecode(seed).strip(),
        head=os.fsdecode(head).strip() if head else None,
        object_format=object_format,
    )
