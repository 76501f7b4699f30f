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
import json
import os
import tempfile
from pathlib import Path

from kagura_agent import __version__

_MAX_ENTRIES = 5000


def cache_dir() -> Path:
    explicit = os.environ.get("KAGURA_AGENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kagura-agent"


def key(*parts: str) -> str:
    digest = hashlib.sha256(__version__.encode())
    for part in parts:
        digest.update(b"\0" + part.encode("utf-8"))
    return digest.hexdigest()


class PassCache:
    """A set of keys known to pass, loaded once and written back when it grew."""

    def __init__(self, name: str) -> None:
        self.path = cache_dir() / f"{name}.json"
        self._keys: set[str] = set()
        self._dirty = False
        try:
            self._keys = set(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            self._keys = set()

    def __contains__(self, item: str) -> bool:
        return item in self._keys

    def add(self, item: str) -> None:
        if item not in self._keys:
            self._keys.add(item)
            self._dirty = True

    def save(self) -> None:
        if not self._dirty:
            return
        keys = sorted(self._keys)[-_MAX_ENTRIES:]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(prefix=".cache-", dir=self.path.parent)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(keys, out)
            os.replace(temp, self.path)
            self._dirty = False
        except OSError:
            pass  # a cache that cannot be written only costs time
