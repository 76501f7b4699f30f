"""Where things live on the host: the state directory and packaged resources."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def state_dir() -> Path:
    """The state directory: $KAGURA_AGENT_STATE_DIR, else $XDG_STATE_HOME/kagura-agent."""
    explicit = os.environ.get("KAGURA_AGENT_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "kagura-agent"


def resource_dir(name: str) -> Path:
    """A packaged resource folder ("schemas", "manifests", "images").

    Installed wheels carry them under kagura_agent/data/; a source checkout keeps them
    at the repository's top level.
    """
    packaged = PACKAGE_DIR / "data" / name
    if packaged.is_dir():
        return packaged
    return PACKAGE_DIR.parent / name


def repo_root() -> Path | None:
    """The source checkout's root when running from one (None from an installed wheel)."""
    root = PACKAGE_DIR.parent
    is_checkout = (root / "images").is_dir() and (root / "pyproject.toml").is_file()
    return root if is_checkout else None


def recipes_root() -> Path:
    """The folder holding images/<recipe>/Dockerfile: the checkout's or the wheel's copy."""
    return resource_dir("images")


def under(path: str, root: str) -> bool:
    """``path`` is ``root`` or inside it, compared as text: resolve both first (realpath)
    when links matter."""
    return path == root or path.startswith(root.rstrip("/") + "/")
