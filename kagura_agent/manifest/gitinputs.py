"""What the operator's next git command in a project root runs, and so the agent may not
rewrite: the root's ``.git``, a hooks folder ``core.hooksPath`` puts in the work tree,
and the configuration the installed hook managers read from the work tree
(manifest/hooksurface.py: pre-commit's, lefthook's, overcommit's, ...).

Each is returned as a host input (path, what it is) for ``task.protected_inputs``, which
mounts its top-level entry under the root read-only for the run. git itself answers where
the hooks folder and the work tree's top are (configuration only: no hook and no
fsmonitor runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from kagura_agent import hostproc
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.hooksurface import surface
from kagura_agent.paths import under

GIT_TIMEOUT = 10.0


def git_metadata(root: str, catalog: Catalog) -> list[tuple[str, str]]:
    """The root's own .git: its hooks and config run on the operator's next git command.

    Read-only unless a Policy of the operator's folder sets ``writable_git: true`` — also
    when there is none yet: a ``.git`` the agent creates (a root inside a larger checkout,
    a folder the operator will ``git status`` in) would be the operator's next git
    command's configuration (``core.fsmonitor``, hooks).
    """
    git = os.path.join(root, ".git")
    if writable_git(catalog):
        return []
    found = [(git, "git metadata (hooks and config run on the operator's next git command)")]
    where = git_paths(root)
    if where is None:
        return found
    top, hooks = where
    if not under(hooks, os.path.realpath(git)):
        what = "the git hooks folder core.hooksPath names (they run on the operator's next commit)"
        found.append((hooks, what))
    # What the installed hooks read from the work tree: the hook managers' own
    # configuration files and folders (the rest is checked after the run:
    # apply/aftercare/hookcheck.py).
    for item in surface(top, hooks).watched:
        path = os.path.join(top, item.rel)
        if item.protect == "always" or (item.protect == "existing" and os.path.lexists(path)):
            found.append((path, item.what))
    return found


def writable_git(catalog: Catalog) -> bool:
    """Whether a Policy of the operator's folder lets agents write ``.git``."""
    return any(
        p.spec.get("writable_git") is True for p in catalog.of("Policy") if p.layer == "operator"
    )


def host_git(
    root: str, args: list[str], timeout: float = GIT_TIMEOUT, *, hooks_off: bool = True
) -> bytes | None:
    """git's standard output for ``git ARGS`` in ``root``, a folder an agent may have
    written (:func:`host_git_run`); None when git is not installed, fails or takes longer
    than ``timeout``."""
    done = host_git_run(root, args, timeout, hooks_off=hooks_off)
    return done.stdout if done is not None and done.returncode == 0 else None


def host_git_run(
    root: str,
    args: list[str],
    timeout: float = GIT_TIMEOUT,
    *,
    stdin: bytes | None = None,
    hooks_off: bool = True,
) -> subprocess.CompletedProcess[bytes] | None:
    """``git ARGS`` in ``root`` as the host runs git where an agent may have written: no
    GIT_* from the environment, ``safe.directory`` for that folder only (the operator
    applies to roots other accounts own: a CI checkout), no hooks and no fsmonitor (a
    command the repository's own config could name); its exit code, stdout and stderr,
    or None when git is not installed or takes longer than ``timeout``. ``hooks_off``
    False only to ask git where the repository's hooks are (no command here runs one)."""
    git = shutil.which("git")
    if git is None:
        return None
    options = [
        "-C",
        root,
        "-c",
        f"safe.directory={root}",
        "-c",
        "core.fsmonitor=false",
        *(["-c", "core.hooksPath=/dev/null"] if hooks_off else []),
    ]
    try:
        feed: dict[str, Any] = (
            {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        )
        return hostproc.run(
            [git, *options, *args],
            env=git_environment(),
            capture_output=True,
            timeout=timeout,
            check=False,
            **feed,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_environment() -> dict[str, str]:
    """The operator's environment for git (hostproc.environment) without GIT_*: a
    GIT_DIR or GIT_CONFIG_* of the operator's shell must not point git elsewhere."""
    return {k: v for k, v in hostproc.environment().items() if not k.startswith("GIT_")}


def git_paths(root: str) -> tuple[str, str] | None:
    """(the work tree's top, the folder git runs hooks from) for a command in ``root``
    (``core.hooksPath`` when set, as husky and similar tools set it to a folder of the work
    tree), resolved; None without git or a work tree."""
    out = host_git(root, ["rev-parse", "--show-toplevel", "--git-path", "hooks"], hooks_off=False)
    lines = os.fsdecode(out).splitlines() if out is not None else []
    if len(lines) != 2:
        return None
    top, hooks = lines
    return os.path.realpath(top), os.path.realpath(os.path.join(root, hooks))
