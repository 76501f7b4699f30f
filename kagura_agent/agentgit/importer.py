"""Take the agent's plain commits into the operator's repository as one new branch.

The bundle (agentgit/export.py) is the agent's writing: hostile bytes. It is first taken
into a scratch repository the host makes for it (no template, no hooks, no fsmonitor; it
borrows the operator's objects read-only through ``objects/info/alternates``, so the
seed is there), and the branch must be:

- what the agent's repository listed for it, and the bundle's only ref;
- descended from the seed: anything else rewrote the operator's history;
- plain commits on top of the seed: every parent the seed or one of the agent's own new
  commits (no root commit, no merge of other history), at most ``MAX_COMMITS``;
- no submodule (a gitlink or a ``.gitmodules`` file added or changed: a URL the
  operator's next ``git submodule update`` would fetch from);
- no object over ``MAX_OBJECT_BYTES`` once inflated.

Only then is it fetched into the operator's repository — from the scratch repository,
so only those commits' objects travel (nothing else the agent's bundle carried), each
checked by fsck on the way in (symlinked .gitattributes, .gitignore and .mailmap are
errors too) — as the new ref ``refs/heads/kagura/<task>/<run>`` (never an existing one: nothing is forced), with
hooks, fsmonitor, automatic gc and maintenance off, no tags, no FETCH_HEAD and no other
ref. Refs of the agent's besides its branch (tags, other branches, notes, replace refs, a
stash) are never imported; the result says how many there were. Every git here runs
through manifest/gitinputs.host_git_run (hostproc: isolated, clean environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kagura_agent.agentgit.export import Exported
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.gitinputs import host_git_run
from kagura_agent.units import format_size

MAX_COMMITS = 1_000
MAX_OBJECT_BYTES = 50 * 2**20
FETCH_SECONDS = 120.0
# What every fetch of the agent's bundle is held to, beyond host_git_run's hooks and
# fsmonitor off: objects checked, nothing run or written besides the one ref.
_FETCH_CONFIG = [
    "-c",
    "transfer.fsckObjects=true",
    "-c",
    "fetch.fsckObjects=true",
    "-c",
    "gc.auto=0",
    "-c",
    "maintenance.auto=false",
    "-c",
    "fetch.writeCommitGraph=false",
    # A .gitattributes, .gitignore or .mailmap that is a symlink is git's warning only:
    # refused here (an older git in the operator's hands would follow it).
    "-c",
    "fetch.fsck.gitattributesSymlink=error",
    "-c",
    "fetch.fsck.gitignoreSymlink=error",
    "-c",
    "fetch.fsck.mailmapSymlink=error",
]
_FETCH = [
    "fetch",
    "--quiet",
    "--no-tags",
    "--no-prune",
    "--no-write-fetch-head",
    "--no-recurse-submodules",
]
Status = Literal["imported", "none", "refused"]


@dataclass(frozen=True)
class Imported:
    """What came of the agent's commits."""

    branch: str
    status: Status
    commits: int = 0
    tip: str | None = None
    why: str = ""
    other_refs: tuple[str, ...] = ()  # the agent's refs not imported (its names: untrusted)

    def to_json(self) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "status": self.status,
            "commits": self.commits,
            "tip": self.tip,
            "why": self.why,
            "other_refs": len(self.other_refs),
        }

    def summary(self, root: str) -> str:
        """One line for the run's live view (no name the agent chose)."""
        others = (
            f"; {len(self.other_refs)} other ref(s) of its repository not imported"
            if self.other_refs
            else ""
        )
        if self.status == "imported":
            return (
                f"the agent's {self.commits} commit(s) are branch {self.branch} of {root}"
                f" (review: git log -p {self.branch}){others}"
            )
        if self.status == "none":
            return f"the agent made no commits ({self.why}){others}"
        return f"the agent's commits were NOT imported: {self.why}{others}"


def import_branch(
    commits: Mapping[str, Any], root: str, branch: str, exported: Exported
) -> Imported:
    """Check ``exported`` and fetch its branch into the operator's repository at ``root``."""
    seed = str(commits["seed"])
    mine = f"refs/heads/{branch}"
    others = tuple(name for _, name in exported.refs if name != mine)
    if exported.problem:
        return Imported(branch, "refused", why=exported.problem, other_refs=others)
    if exported.bundle is None or exported.tip is None or exported.tip == seed:
        return Imported(branch, "none", why="its branch is where it started", other_refs=others)
    scratch = Path(tempfile.mkdtemp(prefix="kagura-import-"))
    try:
        problem, count = _check(commits, scratch, exported.bundle, mine, exported.tip)
        if problem is None:
            problem = _fetch_into_operator(root, scratch, mine, exported.tip)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if problem is not None:
        return Imported(branch, "refused", why=problem, other_refs=others)
    return Imported(branch, "imported", count, exported.tip, other_refs=others)


def _check(
    commits: Mapping[str, Any], scratch: Path, bundle: Path, ref: str, tip: str
) -> tuple[str | None, int]:
    """Why the bundle's branch is not plain commits on top of the seed (None: it is),
    and how many commits it has."""
    seed = str(commits["seed"])
    repo = str(scratch / "repo.git")
    made = host_git_run(
        str(scratch),
        [
            "init",
            "--quiet",
            "--bare",
            "--template=",
            f"--object-format={commits['object_format']}",
            repo,
        ],
    )
    if made is None or made.returncode != 0:
        return "git could not make a scratch repository to check them in", 0
    info = Path(repo, "objects", "info")
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text(os.path.join(str(commits["git_dir"]), "objects") + "\n")
    heads = _git(repo, ["bundle", "list-heads", str(bundle)])
    listed = [line.split(" ", 1) for line in heads.splitlines()] if heads is not None else []
    if listed != [[tip, ref]]:
        return "the bundle is not the branch its repository listed", 0
    # No fsck here (a fetch from a bundle does none): the fetch into the operator's
    # repository checks every object it takes.
    fetched = host_git_run(
        repo, [*_FETCH_CONFIG, *_FETCH, str(bundle), f"{ref}:{ref}"], FETCH_SECONDS
    )
    if fetched is None or fetched.returncode != 0:
        return f"git could not read its bundle ({_first_line(fetched)})", 0
    ancestor = host_git_run(repo, ["merge-base", "--is-ancestor", seed, tip])
    if ancestor is None or ancestor.returncode != 0:
        return f"its branch does not descend from {seed[:12]}: it rewrote the seeded history", 0
    problem, count = _plain(repo, seed, tip)
    if problem is None:
        problem = _no_submodules(repo, seed, tip)
    if problem is None:
        problem = _no_huge_objects(repo, seed, tip)
    return problem, count


def _plain(repo: str, seed: str, tip: str) -> tuple[str | None, int]:
    """Every commit's parents are the seed or the agent's own; none is a root."""
    out = _git(repo, ["rev-list", "--parents", f"--max-count={MAX_COMMITS + 1}", tip, f"^{seed}"])
    if out is None:
        return "git could not list its commits", 0
    rows = [line.split() for line in out.splitlines() if line]
    if len(rows) > MAX_COMMITS:
        return f"more than {MAX_COMMITS} commits", len(rows)
    own = {row[0] for row in rows} | {seed}
    for row in rows:
        if len(row) == 1:
            return f"commit {row[0][:12]} has no parent (a history of its own)", len(rows)
        foreign = [parent for parent in row[1:] if parent not in own]
        if foreign:
            return (
                f"commit {row[0][:12]} has parent {foreign[0][:12]}, neither the seed nor one of"
                " the agent's commits",
                len(rows),
            )
    return None, len(rows)


def _no_submodules(repo: str, seed: str, tip: str) -> str | None:
    """No commit adds or changes a gitlink or a ``.gitmodules`` file."""
    out = host_git_run(
        repo,
        ["log", "--raw", "-z", "-m", "--no-renames", "--no-abbrev", "--format=", tip, f"^{seed}"],
        FETCH_SECONDS,
    )
    if out is None or out.returncode != 0:
        return "git could not read its changes"
    fields = out.stdout.split(b"\0")
    for index, field in enumerate(fields):
        if not field.startswith(b":"):
            continue
        modes = field[1:].split(b" ")
        path = fields[index + 1] if index + 1 < len(fields) else b""
        if len(modes) >= 2 and b"160000" in modes[:2] and modes[1] != b"000000":
            return "a commit adds a submodule (a gitlink)"
        if os.path.basename(path) == b".gitmodules":
            return "a commit changes .gitmodules (submodule URLs)"
    return None


def _no_huge_objects(repo: str, seed: str, tip: str) -> str | None:
    """No new object is larger than MAX_OBJECT_BYTES inflated."""
    names = host_git_run(repo, ["rev-list", "--objects", "--no-object-names", tip, f"^{seed}"])
    if names is None or names.returncode != 0:
        return "git could not list its objects"
    sizes = host_git_run(
        repo, ["cat-file", "--batch-check=%(objectsize)"], FETCH_SECONDS, stdin=names.stdout
    )
    if sizes is None or sizes.returncode != 0:
        return "git could not size its objects"
    for line in sizes.stdout.splitlines():
        if line.isdigit() and int(line) > MAX_OBJECT_BYTES:
            return (
                f"an object of {format_size(int(line))}, over the {format_size(MAX_OBJECT_BYTES)}"
                " one object may weigh"
            )
    return None


def _fetch_into_operator(root: str, scratch: Path, ref: str, tip: str) -> str | None:
    """The one new ref in the operator's repository, fetched from the scratch repository
    (the host's: its config, no hooks): only what the operator lacks travels, exactly the
    checked commits' objects, each checked by fsck on the way in (a fetch from a bundle
    is not)."""
    if _git(root, ["rev-parse", "--verify", "--quiet", ref]) is not None:
        return f"{ref} exists already in the operator's repository (never overwritten)"
    source = str(scratch / "repo.git")
    fetched = host_git_run(root, [*_FETCH_CONFIG, *_FETCH, source, f"{ref}:{ref}"], FETCH_SECONDS)
    if fetched is None or fetched.returncode != 0:
        return f"git refused its objects ({_first_line(fetched)})"
    landed = _git(root, ["rev-parse", "--verify", "--quiet", ref])
    if landed is None or landed.strip() != tip:
        return f"{ref} is not {tip[:12]} after the fetch"
    return None


def _git(root: str, args: list[str]) -> str | None:
    done = host_git_run(root, args, FETCH_SECONDS)
    if done is None or done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace")


def _first_line(done: subprocess.CompletedProcess[bytes] | None) -> str:
    """git's first line of complaint: it may quote what the agent wrote (a path, a ref),
    so it is neutralised here and scrubbed where it is shown."""
    if done is None:
        return "git did not finish"
    text = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return neutralise(text[0][:300], newlines=False) if text else f"exit {done.returncode}"
