"""Where things live on the host: the state directory and packaged resources."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kagura_agent.errors import SetupError

PACKAGE_DIR = Path(__file__).resolve().parent
# Where the host starts every process (hostproc): a folder no agent writes.
NEUTRAL_CWD = "/"
# The folder a kagura-agent child works for: its parent's working directory. The host
# starts its children in NEUTRAL_CWD, never where an agent may write, and hands them this;
# what a command reads "from here" (./manifests, a saved plan's task files) it reads from
# there.
WORKDIR_ENV = "KAGURA_AGENT_WORKDIR"


def workdir() -> Path:
    """The folder this process works for: while it is in the neutral folder it was
    started in, the one its kagura-agent parent handed it (:data:`WORKDIR_ENV`, when an
    existing absolute folder); else its working directory (a process that moved on, such
    as a re-plan in the folder a saved plan was made in, works for where it went)."""
    here = Path.cwd()
    handed = os.environ.get(WORKDIR_ENV, "")
    if str(here) == NEUTRAL_CWD and os.path.isabs(handed) and os.path.isdir(handed):
        return Path(handed)
    return here


def state_dir() -> Path:
    """The state directory: $KAGURA_AGENT_STATE_DIR, else $XDG_STATE_HOME/kagura-agent."""
    return home_dir("KAGURA_AGENT_STATE_DIR", "XDG_STATE_HOME", ".local/state")


# The embedded memory store's file in the state directory (memory/sqlite.py opens it).
MEMORY_FILE = "memory.db"


def sqlite_path(section: Mapping[str, Any]) -> Path:
    """Where the embedded memory store lives: ``state-dir`` means ``<state_dir>/memory.db``.
    Here, not in kagura_agent.memory, so validate resolves it without loading the stores."""
    location = str(section.get("location") or "state-dir")
    if location == "state-dir":
        return state_dir() / MEMORY_FILE
    return Path(location).expanduser()


def home_dir(explicit_env: str, xdg_env: str, default: str) -> Path:
    """``$explicit_env``, else ``$xdg_env/kagura-agent``, else ``~/default/kagura-agent``.

    A relative ``$explicit_env`` is refused: the ledger, graduation and cache would then
    be a different folder in every working directory (and one inside the project root
    the agent writes). A relative ``$xdg_env`` is ignored, as the XDG spec says.
    """
    explicit = os.environ.get(explicit_env)
    if explicit:
        chosen = Path(explicit).expanduser()
        if not chosen.is_absolute():
            raise SetupError(
                f"{explicit_env} must be an absolute path, not {explicit!r}",
                hint=f"export {explicit_env}=$PWD/{explicit} if that folder is meant",
            )
        return chosen
    xdg = os.environ.get(xdg_env, "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / default
    return base / "kagura-agent"


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
