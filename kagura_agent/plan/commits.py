"""The plan's ``commits`` section: the agent's commits come back as a branch
(``spec.commits: branch``; kagura_agent/agentgit has the whole flow).

Pure: what the operator's repository offers is a fact (``Facts.git_base``, gathered by
agentgit/base.py). In branch mode the plan

- moves the read-only mount of the operator's ``.git`` from ``/workspace/.git`` to
  ``OPERATOR_GIT`` (the agent's repository borrows its objects from there), and
- puts a tmpfs owned by the agent at ``/workspace/.git`` (``AGENT_GIT``): the agent's own
  repository. Being a mount point, it still keeps the host's ``.git`` from being renamed
  or removed through the project root, and nothing written there reaches the host.

The membrane floor holds the pair together (membrane/floor.py): the operator's ``.git``
away from ``/workspace/.git`` only with that tmpfs over it. A task that asks for the
branch where it cannot be (no repository, a linked worktree, no commit, the brain on the
host, ``writable_git``) is refused, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kagura_agent.membrane.floor import AGENT_GIT, OPERATOR_GIT
from kagura_agent.plan.model import CommitsSection, Hardening, Mount, Refusal
from kagura_agent.units import format_size

# The agent's repository: a tmpfs (its new objects and index; the operator's objects are
# borrowed), and the most its commits may weigh as one git bundle.
REPO_BYTES = 256 * 2**20
BUNDLE_BYTES = 100 * 2**20
TMPFS_FLAGS = "rw,noexec,nosuid,nodev"


def section(
    task_name: str, root: str, base: Mapping[str, Any] | None, *, runtime: str, writable_git: bool
) -> CommitsSection:
    """The ``commits`` section of a task that asks for its commits as a branch."""
    found: Mapping[str, Any] = base or {}
    problem = found.get("problem")
    if runtime != "container":
        problem = "the brain runs on the host: there is no container for its repository"
    elif writable_git:
        problem = "a Policy sets writable_git: true, so agents write the repository itself"
    elif base is None:
        problem = "the operator's repository was not looked at"
    return {
        "mode": "branch",
        "branch": f"kagura/{task_name}/<run>",
        "git_dir": str(found.get("git_dir") or os.path.join(root, ".git")),
        "seed": found.get("seed"),
        "head": found.get("head"),
        "object_format": str(found.get("object_format") or "sha1"),
        "repo_bytes": REPO_BYTES,
        "bundle_bytes": BUNDLE_BYTES,
        "problem": problem,
    }


def branch_of(commits: Mapping[str, Any], run_id: str) -> str:
    """The branch name a run's commits come back as."""
    return str(commits["branch"]).replace("<run>", run_id)


def mounts(found: list[Mount], commits: CommitsSection | None) -> list[Mount]:
    """The plan's mounts with the operator's ``.git`` moved to ``OPERATOR_GIT``."""
    if commits is None or commits["problem"]:
        return found
    moved: list[Mount] = []
    for mount in found:
        if mount["kind"] == "protected" and mount["target"] == AGENT_GIT:
            mount = {
                **mount,
                "target": OPERATOR_GIT,
                "protects": (
                    "git metadata (its objects lent to the agent's own repository, a tmpfs"
                    " at /workspace/.git)"
                ),
            }
        moved.append(mount)
    return moved


def hardening(found: Hardening, commits: CommitsSection | None) -> Hardening:
    """The hardening with the agent's repository tmpfs at ``AGENT_GIT``."""
    if commits is None or commits["problem"]:
        return found
    uid, _, gid = found["user"].partition(":")
    options = f"{TMPFS_FLAGS},size={commits['repo_bytes']},mode=0700,uid={uid},gid={gid or uid}"
    return {**found, "tmpfs": {**found["tmpfs"], AGENT_GIT: options}}


def refusals(commits: CommitsSection | None) -> list[Refusal]:
    if commits is None or not commits["problem"]:
        return []
    return [
        {
            "code": "commits-unavailable",
            "message": f"the agent's commits cannot come back as a branch: {commits['problem']}",
            "source": "$.commits",
        }
    ]


def text(commits: CommitsSection) -> str:
    """The plan's ``commits`` line."""
    if commits["problem"]:
        return f"as a branch: NOT POSSIBLE ({commits['problem']})"
    seed = str(commits["seed"] or "")[:12]
    head = commits["head"] or "a detached HEAD"
    on = head.removeprefix("refs/heads/")
    return (
        f"branch {commits['branch']} of {commits['git_dir']}: the agent commits in a"
        f" repository of its own (seeded from {seed} on {on}; no hooks or config of yours;"
        f" {format_size(commits['repo_bytes'])} tmpfs); after the run only plain commits on"
        f" top of {seed} come back (no tags or other refs, no rewrite, at most"
        f" {format_size(commits['bundle_bytes'])}), fetched with hooks and fsmonitor off;"
        " nothing is pushed"
    )
