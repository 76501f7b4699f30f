"""After a run: nothing it wrote is run by the operator's git hooks (manifest/hooksurface.py).

The plan protects the hook managers' own configuration read-only for the run; what it
cannot protect — a file that does not exist yet (``lefthook-local.yml``, a
``pre_commit/`` package at the top of the work tree), the copy of lefthook under
``node_modules``, a script a hook names, ``package.json``'s ``simple-git-hooks`` section —
is checked once the run's last container is gone. Each watched path the run created or
changed (ctime at or after the run's start, which nobody can set back; for a folder,
anything in it) is moved aside, to ``<name>.kagura-refused-<n>`` in its folder, as a
planted repository is (apply/aftercare/gitlinks.py): never deleted, and the run's summary names it.

Module shadowing: a hook that runs ``python -m`` (pre-commit's runs
``"$INSTALL_PYTHON" -mpre_commit``) imports from the top of the work tree first. A module
or package there the run created or changed is moved aside when its name is one that
Python could import from elsewhere: the standard library's, an installed distribution's
(asked of each interpreter the hooks name, isolated), ``sitecustomize``/``usercustomize``,
or the module the hook runs. Other new modules at the top (the project's own) stay.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import dataclass

from kagura_agent import hostproc
from kagura_agent.apply.aftercare.setid import WITHHELD_NAMES
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.gitinputs import git_paths
from kagura_agent.manifest.hooksurface import Surface, Watched, surface
from kagura_agent.paths import under

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_TREE_ENTRIES = 200_000
MAX_JSON_BYTES = 4 << 20
NAMES_SECONDS = 30.0
# Importable at the top of a work tree: NAME.py, NAME.pyc, NAME(.tag).so, or a folder.
_MODULE_FILE = re.compile(r"^([A-Za-z_]\w*)(?:\.py|\.pyc|\.pyw|(?:\.[\w-]+)?\.so)$")
_INIT = re.compile(r"^__init__(?:\.py|\.pyc|(?:\.[\w-]+)?\.so)$")
# Standard library parts no tool imports on its own: a project's test/ folder stays.
_NEVER_IMPORTED = frozenset({"test", "idlelib", "turtledemo", "this", "antigravity"})
_NAMES = (
    "import json, pkgutil, site, sys\n"
    "paths = [p for p in sys.path if p] + [site.getusersitepackages()]\n"
    "names = {m.name for m in pkgutil.iter_modules(paths)}\n"
    "names |= set(sys.stdlib_module_names) | set(sys.builtin_module_names)\n"
    "print(json.dumps(sorted(names)))\n"
)


@dataclass(frozen=True)
class HookSnapshot:
    """Before the run: the digest of each (file, key) a hook manager reads commands from."""

    taken: float
    keys: dict[str, str]


@dataclass(frozen=True)
class HookReport:
    """What the check moved aside — (path, where to, why), relative to the root — and what
    it could not check."""

    moved: tuple[tuple[str, str, str], ...] = ()
    problems: tuple[str, ...] = ()

    def summary(self, *, withhold_names: bool = False) -> list[str]:
        """Lines for the live view; with ``withhold_names`` (a killed run's root, swept by a
        later run: setid.SetidReport.summary) counts only."""
        if withhold_names:
            lines = []
            if self.moved:
                lines.append(
                    f"moved aside {len(self.moved)} file(s) the run wrote that the operator's"
                    f" git hooks would have run; {WITHHELD_NAMES}"
                )
            if self.problems:
                lines.append(
                    f"could not check {len(self.problems)} hook input(s); {WITHHELD_NAMES}"
                )
            return lines
        lines = [
            f"moved aside {_one_line(rel)} -> {_one_line(to)}: {why} (the operator's git hooks"
            " would have run it)"
            for rel, to, why in self.moved
        ]
        return lines + [f"could not check {_one_line(p)}" for p in self.problems]

    def to_json(self) -> list[dict[str, str]]:
        return [{"path": rel, "to": to, "why": why} for rel, to, why in self.moved]


def snapshot(root: str) -> HookSnapshot:
    """Before the run's first container: the commands ``package.json`` gives a hook
    manager that reads them from there (simple-git-hooks, husky 4), by digest."""
    taken = time.time()
    found = _surface(root)
    keys = {}
    if found is not None:
        for file, key in found.json_keys:
            keys[f"{file}#{key}"] = _key_digest(os.path.join(found.top, file), key) or ""
    return HookSnapshot(taken, keys)


def check_hooks(root: str, since: float, before: HookSnapshot | None = None) -> HookReport:
    """Move aside what the run created or changed that the installed hooks read or run.
    Never raises OSError."""
    real = os.path.realpath(root)
    found = _surface(real)
    if found is None:
        return HookReport()
    if before is not None:
        since = max(since, before.taken - 0.05)
    moved: list[tuple[str, str, str]] = []
    problems: list[str] = []
    for item in found.watched:
        _check_watched(real, found.top, item, since, moved, problems)
    for file, key in found.json_keys:
        path = os.path.join(found.top, file)
        recorded = None if before is None else before.keys.get(f"{file}#{key}")
        if under(path, real) and _changed(path, since) and _key_digest(path, key) != recorded:
            why = f"its {key!r} section changed: the commands the hook manager installs or runs"
            _move(real, path, why, moved, problems)
    if found.pythons and under(found.top, real):
        _check_modules(real, found, since, moved, problems)
    return HookReport(tuple(moved), tuple(problems))


def _surface(root: str) -> Surface | None:
    where = git_paths(root)
    return None if where is None else surface(*where)


def _check_watched(
    root: str,
    top: str,
    item: Watched,
    since: float,
    moved: list[tuple[str, str, str]],
    problems: list[str],
) -> None:
    path = os.path.normpath(os.path.join(top, item.rel))
    if not under(path, root) or path == root:
        return
    try:
        changed = _tree_changed(path, since) if item.tree else _changed(path, since)
    except OSError as exc:
        problems.append(f"{os.path.relpath(path, root)} ({exc.strerror})")
        return
    if changed:
        _move(root, path, item.what, moved, problems)


def _check_modules(
    root: str, found: Surface, since: float, moved: list[tuple[str, str, str]], problems: list[str]
) -> None:
    """Modules the run created or changed at the top, named like one the hooks' Python
    could import from elsewhere."""
    candidates = []
    try:
        entries = list(os.scandir(found.top))
    except OSError as exc:
        problems.append(f"the top of the work tree ({exc.strerror})")
        return
    for entry in entries:
        name = _module_name(entry, found.modules)
        if name is None or name in _NEVER_IMPORTED:
            continue
        try:
            if _tree_changed(entry.path, since):
                candidates.append((name, entry.path))
        except OSError as exc:
            problems.append(f"{entry.name} ({exc.strerror})")
    if not candidates:
        return
    names = _importable(found.pythons) | set(found.modules) | {"sitecustomize", "usercustomize"}
    for name, path in candidates:
        if name in names:
            why = f"a module named {name!r} at the top of the work tree, imported by the hooks' python -m"
            _move(root, path, why, moved, problems)


def _module_name(entry: os.DirEntry[str], run: tuple[str, ...]) -> str | None:
    """The module ``entry`` is at the top of a sys.path entry, when it can shadow one found
    further on: a module file, or a regular package (a folder with an ``__init__``). A
    folder without one is a namespace portion, which loses to a module found later — a
    project's ``build/`` stays — unless it is a module a hook runs with -m (``-m X`` runs a
    namespace ``X/__main__.py`` when X is installed nowhere)."""
    if entry.is_dir(follow_symlinks=False):
        if not entry.name.isidentifier():
            return None
        try:
            regular = any(_INIT.match(name) for name in os.listdir(entry.path))
        except OSError:
            regular = True  # unreadable: counted
        return entry.name if regular or entry.name in run else None
    match = _MODULE_FILE.match(entry.name)
    return match.group(1) if match else None


def _importable(pythons: tuple[str, ...]) -> set[str]:
    """Top-level names each interpreter can import (standard library, installed
    distributions, its user site), asked of it isolated from /; this process's standard
    library's when one cannot be asked."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    env = hostproc.environment()
    for python in pythons:
        program = python if os.path.isabs(python) else shutil.which(python, path=env.get("PATH"))
        if program is None or not hostproc.is_python(program):
            continue
        with contextlib.suppress(OSError, ValueError, hostproc.UnsafeStart):
            done = hostproc.run(
                [program, "-I", "-c", _NAMES],
                env=env,
                capture_output=True,
                text=True,
                timeout=NAMES_SECONDS,
                check=False,
            )
            if done.returncode == 0:
                names |= set(json.loads(done.stdout))
    return names


def _changed(path: str, since: float) -> bool:
    """Whether ``path`` (not followed) exists and was created or changed at/after ``since``."""
    try:
        return os.lstat(path).st_ctime >= since
    except FileNotFoundError:
        return False


def _tree_changed(path: str, since: float) -> bool:
    """Whether ``path`` or anything under it (never following a symlink) changed since."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if st.st_ctime >= since:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    seen = 0
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > MAX_TREE_ENTRIES:
                    return True  # too large to tell: checked as changed
                if entry.stat(follow_symlinks=False).st_ctime >= since:
                    return True
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return False


def _key_digest(path: str, key: str) -> str | None:
    """sha256 of ``key``'s value in the JSON file at ``path``; None when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a file"
        data = os.read(fd, MAX_JSON_BYTES + 1)
    finally:
        os.close(fd)
    try:
        value = json.loads(data)
    except ValueError:
        return "unreadable"
    if not isinstance(value, dict) or key not in value:
        return None
    return hashlib.sha256(json.dumps(value[key], sort_keys=True).encode()).hexdigest()


def _move(
    root: str, path: str, why: str, moved: list[tuple[str, str, str]], problems: list[str]
) -> None:
    """Rename ``path`` aside in its folder, reached from the root without following a
    symlink (a component that is one is moved aside instead: it leads the hook elsewhere)."""
    rel = os.path.relpath(path, root)
    parts = [p for p in rel.split(os.sep) if p not in ("", ".")]
    try:
        fd = os.open(root, _DIR)
    except OSError as exc:
        problems.append(f"{rel} ({exc.strerror})")
        return
    try:
        walked: list[str] = []
        for name in parts[:-1]:
            if stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode):
                why = f"a symlink on the way to {rel}"
                break
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
            walked.append(name)
        name = parts[len(walked)]
        here = "/".join([*walked, name])
        for n in range(1, 1000):
            aside = f"{name}.kagura-refused-{n}"
            try:
                os.lstat(aside, dir_fd=fd)
            except FileNotFoundError:
                os.rename(name, aside, src_dir_fd=fd, dst_dir_fd=fd)
                moved.append((here, "/".join([*walked, aside]), why))
                return
        problems.append(f"{here} (no free name to move it aside to)")
    except OSError as exc:
        problems.append(f"{rel} ({exc.strerror})")
    finally:
        os.close(fd)


def _one_line(text: str) -> str:
    return neutralise(text, newlines=False)
