"""Take the agent's branch out of its container: its refs, and one bundle, bounded.

Both come through ``docker exec`` of the image's git in the agent's still-running
container (agentgit/seed.py says how it is run there), read by the host from the exec's
output stream into a file of its own, at most ``limit`` bytes: no path of the agent's is
ever opened on the host, so a symlink, a FIFO or a hard link it planted leads nowhere.
What is read is the agent's writing, for agentgit/importer.py to check.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from kagura_agent.agentgit.seed import bundle_argv, refs_argv
from kagura_agent.errors import KaguraError
from kagura_agent.units import format_size

MAX_LISTING_BYTES = 1 * 2**20  # the refs listing
MAX_REFS = 10_000
_REF_LINE = re.compile(r"^([0-9a-f]{40}(?:[0-9a-f]{24})?) (refs/\S+)$")


class Execs(Protocol):
    """What the export needs of the runtime (apply/run/context.ApplyRuntime has it)."""

    def exec_stream(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        workdir: str,
        into: BinaryIO,
        limit: int,
    ) -> tuple[int, int, bool]: ...


@dataclass(frozen=True)
class Exported:
    """What came out of the agent's repository (``problem``: why nothing usable did)."""

    refs: tuple[tuple[str, str], ...] = ()  # (object id, ref name) as the repository listed
    tip: str | None = None  # its branch's commit
    bundle: Path | None = None  # the branch on top of the seed (None: no commits, or refused)
    problem: str | None = None


def export_branch(
    runtime: Execs,
    container_id: str,
    *,
    user: str,
    seed: str,
    branch: str,
    limit: int,
    folder: Path,
    note: Callable[[str], None] = lambda _line: None,
) -> Exported:
    """The agent's refs and a bundle of ``branch`` past ``seed`` into ``folder``."""
    listing = folder / "refs.txt"
    try:
        with listing.open("wb") as out:
            code, size, whole = runtime.exec_stream(
                container_id, refs_argv(), user=user, workdir="/", into=out, limit=MAX_LISTING_BYTES
            )
    except KaguraError as exc:
        return Exported(problem=f"its repository could not be read: {exc.message}")
    if code != 0 or not whole:
        why = "more refs than can be listed" if not whole else f"git exited {code}"
        return Exported(problem=f"its repository could not be listed ({why})")
    refs, problem = parse_refs(listing.read_bytes())
    if problem:
        return Exported(problem=problem)
    tips = [sha for sha, name in refs if name == f"refs/heads/{branch}"]
    if not tips:
        return Exported(refs, problem=f"its repository has no branch {branch} (deleted or renamed)")
    tip = tips[0]
    if tip == seed:
        return Exported(refs, tip)  # no commits
    note(f"taking the agent's branch {branch} out of its container")
    bundle = folder / "branch.bundle"
    try:
        with bundle.open("wb") as out:
            code, size, whole = runtime.exec_stream(
                container_id,
                bundle_argv(seed, branch),
                user=user,
                workdir="/",
                into=out,
                limit=limit,
            )
    except KaguraError as exc:
        return Exported(refs, tip, problem=f"its branch could not be bundled: {exc.message}")
    if not whole:
        return Exported(refs, tip, problem=f"its commits weigh more than {format_size(limit)}")
    if code != 0 or size == 0:
        return Exported(refs, tip, problem=f"its branch could not be bundled (git exited {code})")
    return Exported(refs, tip, bundle)


def parse_refs(data: bytes) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``SHA REFNAME`` lines, or why they are not that."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return (), "its refs listing is not text"
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        match = _REF_LINE.match(line)
        if match is None:
            return (), "its refs listing is not what git lists"
        found.append((match[1], match[2]))
        if len(found) > MAX_REFS:
            return (), f"its repository has more than {MAX_REFS} refs"
    return tuple(found), None
