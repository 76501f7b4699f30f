"""A dispatch request from the brain, checked before anything is planned.

Only names and bounded text: the manifests give everything else. Whatever is wrong is
reported at once, every problem, as the reasons the child is refused.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_TEXT = 64 * 1024
MAX_ITEMS = 16


class Refused(Exception):
    """The child will not run; every reason goes back to the parent's brain."""

    def __init__(self, reasons: list[str], fingerprint: str | None = None) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons
        self.fingerprint = fingerprint


@dataclass(frozen=True)
class ChildRequest:
    """What the brain asked for, checked; names only — the manifests give the rest."""

    name: str
    prompt: str
    steps: tuple[str, ...] | None
    egress: tuple[str, ...] | None  # None: the parent's baseline egress
    credentials: tuple[dict[str, str], ...]
    context: tuple[str, ...]
    notes: tuple[str, ...]
    workdir: str
    verify: tuple[str, ...]

    @classmethod
    def parse(cls, fields: Mapping[str, Any], default_name: str) -> ChildRequest:
        problems: list[str] = []
        prompt = fields.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_TEXT:
            problems.append(f"prompt must be text of 1..{MAX_TEXT} characters")
        name = fields.get("name") or default_name
        if not isinstance(name, str) or not NAME.match(name):
            problems.append(f"name {name!r} must be lowercase letters, digits and dashes")
        workdir = fields.get("workdir") or name
        if not isinstance(workdir, str) or not _relative(workdir):
            problems.append(f"workdir {workdir!r} must be a relative folder inside the project")
        lists = {k: _strings(fields, k, problems) for k in ("egress", "context", "notes", "verify")}
        steps = _strings(fields, "steps", problems)
        credentials = fields.get("credentials") or []
        if not isinstance(credentials, list) or not all(
            isinstance(c, dict) and {"provider", "scope"} <= set(c) for c in credentials
        ):
            problems.append("credentials must be a list of {provider, scope}")
            credentials = []
        if problems:
            raise Refused(problems)
        return cls(
            name=str(name),
            prompt=str(prompt),
            steps=tuple(steps) if "steps" in fields else None,
            egress=tuple(lists["egress"]) if "egress" in fields else None,
            credentials=tuple(
                {"provider": str(c["provider"]), "scope": str(c["scope"])} for c in credentials
            ),
            context=tuple(lists["context"]),
            notes=tuple(lists["notes"]),
            workdir=str(workdir),
            verify=tuple(lists["verify"]),
        )


def _strings(fields: Mapping[str, Any], key: str, problems: list[str]) -> list[str]:
    value = fields.get(key) or []
    if (
        not isinstance(value, list)
        or len(value) > MAX_ITEMS
        or not all(isinstance(v, str) and 0 < len(v) <= MAX_TEXT for v in value)
    ):
        problems.append(f"{key} must be a list of at most {MAX_ITEMS} non-empty strings")
        return []
    return list(value)


def _relative(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts


def make_workdir(parent_root: str, workdir: str) -> Path:
    """The child's project root, ``workdir`` under ``parent_root``: made (owned like the
    parent's root) where missing, one component at a time through directory descriptors
    opened with O_NOFOLLOW.

    The parent's agent writes anything under its root while its child is planned, so a
    component may be a symlink it planted (``a -> /etc``, ``a -> /root``): the host,
    possibly root, would create and chown a folder wherever it points. Any symlink in the
    way refuses the child instead; nothing is made outside the parent's root.
    """
    owner = os.stat(parent_root)
    fd = os.open(parent_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in Path(workdir).parts:
            made = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)  # mkdir never follows a final symlink
                made = True
            try:
                child = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError:  # ELOOP: a symlink; ENOTDIR: a file
                raise Refused(
                    [f"workdir {workdir!r}: {part!r} is not a folder of the project (a symlink?)"]
                ) from None
            os.close(fd)
            fd = child
            if made:
                with contextlib.suppress(PermissionError):
                    os.fchown(fd, owner.st_uid, owner.st_gid)
    finally:
        os.close(fd)
    return Path(parent_root) / workdir
