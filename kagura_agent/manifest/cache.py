"""A content-addressed cache of checks whose result depends only on their inputs.

``validate`` and ``plan`` run the same JSON Schema checks on the same bytes again and
again; importing jsonschema and compiling its validators costs more than everything else
``plan`` does. Results are keyed by the sha256 of exactly what was checked plus the
schema and tool versions, so a hit is always the result a fresh check would give: a
changed byte, schema or kagura-agent version is a different key. Only *passing* results
are cached (failures are always re-checked, so every error is reported with its
location). The cache lives in $KAGURA_AGENT_CACHE_DIR or $XDG_CACHE_HOME/kagura-agent;
if it cannot be read or written, everything is simply checked.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from kagura_agent import __version__
from kagura_agent.paths import home_dir

# Entries not written for this long are pruned (a pass is then simply checked again).
_MAX_AGE_SECONDS = 30 * 86400
_PRUNE_EVERY = 200  # adds


def cache_dir() -> Path:
    """$KAGURA_AGENT_CACHE_DIR (absolute), else $XDG_CACHE_HOME/kagura-agent."""
    return home_dir("KAGURA_AGENT_CACHE_DIR", "XDG_CACHE_HOME", ".cache")


def key(*parts: str) -> str:
    digest = hashlib.sha256(__version__.encode())
    for part in parts:
        digest.update(b"\0" + part.encode("utf-8"))
    return digest.hexdigest()


class PassCache:
    """Keys known to pass, one empty file per key: a look-up is one ``stat``.

    (A single JSON file of keys grew to hundreds of kilobytes and cost more to parse on
    every run than the checks it saved.)
    """

    def __init__(self, name: str) -> None:
        self.folder = cache_dir() / name
        self._added = 0

    def _path(self, item: str) -> Path:
        return self.folder / item[:2] / item

    def __contains__(self, item: str) -> bool:
        return self._path(item).exists()

    def read(self, item: str) -> str | None:
        """What was stored with ``item`` ('' for a plain pass); None when not cached."""
        try:
            return self._path(item).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def add(self, item: str, content: str = "") -> None:
        path = self._path(item)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if content:
                tmp = path.with_name(f".{path.name}.{os.getpid()}")
                tmp.write_text(content, encoding="utf-8")
                os.replace(tmp, path)
            else:
                path.touch()
        except OSError:
            return  # a cache that cannot be written only costs time
        self._added += 1
        if self._added % _PRUNE_EVERY == 0:
            self.prune()

    def prune(self, now: float | None = None) -> int:
        """Remove entries older than the maximum age; returns how many."""
        cutoff = (now if now is not None else time.time()) - _MAX_AGE_SECONDS
        removed = 0
        for entry in self.folder.glob("*/*"):
            try:
                if entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed += 1
            except OSError:
                continue
        return removed

    def save(self) -> None:
        """Entries are written as they are added; kept so callers need not know."""
