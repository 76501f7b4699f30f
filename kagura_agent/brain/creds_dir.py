"""Leased credential files inside the container (stdlib only).

The host pushes a lease's bundle over the channel; this writes its files under the
credentials directory (a tmpfs at /run/kagura/creds in the container; KAGURA_CREDS_DIR
overrides it for tests) with owner-only modes, rewrites them on renewal, and removes
them on revoke or exit. Nothing here is ever logged: paths only, never contents.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

CREDS_DIR_ENV = "KAGURA_CREDS_DIR"
DEFAULT_CREDS_DIR = "/run/kagura/creds"


class CredentialPathError(ValueError):
    """A bundle named a file outside the credentials directory."""


def creds_root() -> Path:
    """The configured credentials directory."""
    return Path(os.environ.get(CREDS_DIR_ENV) or DEFAULT_CREDS_DIR)


def _relative(name: str) -> PurePosixPath:
    rel = PurePosixPath(name)
    if rel.is_absolute() or not rel.parts or any(p in ("..", ".", "") for p in rel.parts):
        raise CredentialPathError(f"credential file name {name!r} must be a plain relative path")
    return rel


class CredentialDir:
    """Owns the files and environment of every live lease."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, set[PurePosixPath]] = {}  # lease -> its files
        self._owner: dict[PurePosixPath, str] = {}  # file -> the lease that wrote it last
        self._env: dict[str, dict[str, str]] = {}

    def apply(self, lease: str, files: Mapping[str, str], env: Mapping[str, str]) -> None:
        """Write (or, for a renewal, rewrite) a lease's files and record its env."""
        wanted = {_relative(name): content for name, content in files.items()}
        self._ensure_dir(self.root)
        for rel, content in wanted.items():
            self._write(rel, content)
            self._owner[rel] = lease
        for stale in self._files.get(lease, set()) - set(wanted):
            self._remove(lease, stale)
        self._files[lease] = set(wanted)
        self._env[lease] = {str(k): str(v) for k, v in env.items()}

    def revoke(self, lease: str) -> None:
        """Remove a lease's files and env; unknown leases are a no-op."""
        for rel in self._files.pop(lease, set()):
            self._remove(lease, rel)
        self._env.pop(lease, None)

    def wipe_all(self) -> None:
        """Revoke every lease (on stop, EOF or crash)."""
        for lease in list(self._files):
            self.revoke(lease)

    def env(self) -> dict[str, str]:
        """The merged env of all live leases (later leases win)."""
        merged: dict[str, str] = {}
        for values in self._env.values():
            merged.update(values)
        return merged

    def _ensure_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)

    def _write(self, rel: PurePosixPath, content: str) -> None:
        target = self.root.joinpath(*rel.parts)
        for parent in reversed(target.relative_to(self.root).parents[:-1]):
            self._ensure_dir(self.root / parent)
        tmp = target.with_name(f".{target.name}.tmp")
        # O_EXCL on a fresh temp name, then rename: a reader never sees half a file
        # and the mode is 0600 from the first byte.
        if tmp.exists():
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.replace(tmp, target)

    def _remove(self, lease: str, rel: PurePosixPath) -> None:
        if self._owner.get(rel) != lease:
            return  # a later lease rewrote this file; it is theirs to remove
        del self._owner[rel]
        target = self.root.joinpath(*rel.parts)
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        # Remove now-empty parent directories up to (not including) the root.
        for parent in target.relative_to(self.root).parents[:-1]:
            try:
                (self.root / parent).rmdir()
            except OSError:
                break
