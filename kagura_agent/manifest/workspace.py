"""Load the manifest set and task files, check everything, report every problem at once."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kagura_agent import hostproc
from kagura_agent.errors import Diagnostic, UsageError, ValidationError
from kagura_agent.manifest.catalog import Catalog, build_catalog
from kagura_agent.manifest.checks import check_catalog, inline_secrets, text_secrets
from kagura_agent.manifest.loader import (
    YAML_SUFFIXES,
    Sources,
    display_path,
    manifests_dir,
    packaged_dir,
    read_paths,
    read_text_source,
    same_dir,
)
from kagura_agent.manifest.task import ResolvedTask, resolve_task
from kagura_agent.manifest.yamlpos import YamlDoc


@dataclass(frozen=True)
class Workspace:
    catalog: Catalog
    tasks: list[ResolvedTask]
    manifest_dir: Path
    document_count: int


def load_workspace(
    manifests: str | None, paths: list[str], *, base_rev: str | None = None
) -> Workspace:
    """Read the manifest set (or its state at git ``base_rev``) plus ``paths``; check all.

    Raises ValidationError carrying every diagnostic when anything is wrong.
    """
    directory = manifests_dir(manifests)
    packaged = packaged_dir()
    own_layer = not same_dir(directory, packaged)
    if base_rev and not own_layer:
        # Reviewing the packaged set itself at a revision: that revision is the bottom layer.
        sources = _git_sources(directory, base_rev, "packaged")
    else:
        sources = read_paths([packaged], "packaged")
    # Shown like the operator's folder (relative to the working directory when under it),
    # so a saved plan re-planned with the absolute manifests_dir has the same inputs.
    shown = "<packaged>" if own_layer else display_path(directory)
    layers = [_layer("packaged", shown, packaged, sources)]
    if own_layer:
        own = (
            _git_sources(directory, base_rev, "operator")
            if base_rev
            else read_paths([directory], "operator", skip=sources.real_paths)
        )
        sources.extend(own)
        layers.append(_layer("operator", display_path(directory), directory, own))
    # A path that is (inside) the manifest set is not read again as a task file. At a git
    # revision the task files are read as they were there too: a branch that only edits
    # a task (a wider egress, a longer budget) must show as a change against the base.
    if base_rev:
        sources.extend(_git_task_sources([Path(p) for p in paths], base_rev, directory))
    else:
        sources.extend(read_paths([Path(p) for p in paths], "task", skip=sources.real_paths))
    catalog, task_manifests, problems = build_catalog(sources)
    origin = str(directory.resolve()) + (f"@{base_rev}" if base_rev else "")
    catalog = replace(catalog, origin=origin, layers=tuple(layers))
    # Syntax errors, duplicate keys and unreadable files were found while reading.
    problems = [*sources.problems, *problems]
    problems.extend(_secrets(sources))
    problems.extend(check_catalog(catalog))
    tasks: list[ResolvedTask] = []
    for manifest in task_manifests:
        resolved, found = resolve_task(manifest, catalog)
        problems.extend(found)
        if resolved is not None:
            tasks.append(resolved)
    if problems:
        raise ValidationError(_dedupe(problems))
    return Workspace(catalog, tasks, directory, len(sources.docs))


def _layer(name: str, shown: str, path: Path, sources: Sources) -> MappingProxyType[str, Any]:
    return MappingProxyType(
        {
            "layer": name,
            "dir": shown,
            "path": str(path.resolve()),
            "files": sorted(sources.digests),
            # Where each file really is: a symlinked file or folder may lie elsewhere.
            "reads": tuple(sorted(sources.real_paths)),
        }
    )


def layers_report(catalog: Catalog) -> list[dict[str, Any]]:
    """The layers in force, bottom first, for ``validate --json`` and ``doctor --json``."""
    return [
        {"layer": info["layer"], "path": info["path"], "files": list(info["files"])}
        for info in catalog.layers
    ]


def layers_summary(catalog: Catalog) -> str:
    """One line: each layer's folder and file count, and what the operator replaced."""
    text = " + ".join(
        f"{info['layer']} {info['path']} ({len(info['files'])} files)" for info in catalog.layers
    )
    if len(catalog.layers) == 1:
        text += " (no operator folder: --manifests DIR, $KAGURA_AGENT_MANIFESTS or ./manifests)"
    if catalog.overrides:
        text += "; the operator's folder replaces " + ", ".join(catalog.overrides)
    return text


def _dedupe(problems: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple[str, int, int, str, str]] = set()
    unique = []
    for problem in problems:
        key = (problem.file, problem.line, problem.col, problem.path, problem.message)
        if key not in seen:
            seen.add(key)
            unique.append(problem)
    unique.sort(key=lambda d: (d.file, d.line, d.col))
    return unique


def _git_sources(directory: Path, rev: str, layer: str) -> Sources:
    """The manifest set as it was at ``rev``, read with git (no checkout)."""
    try:
        top = _git(directory, "rev-parse", "--show-toplevel").strip()
        prefix = str(directory.resolve().relative_to(Path(top).resolve()))
        # From the top level: in a subdirectory git reads the pathspec relative to it.
        listing = _git(Path(top), "ls-tree", "-r", "--name-only", rev, "--", prefix)
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or "").strip().splitlines()
        raise UsageError(
            f"cannot read manifests at git revision {rev!r}: "
            + (said[0] if said else f"git exited {exc.returncode}"),
            hint="--base takes a commit, branch or tag of the repository holding the manifests",
        ) from None
    except (ValueError, OSError) as exc:
        raise UsageError(f"cannot read manifests at git revision {rev!r}: {exc}") from exc
    sources = Sources()
    for name in sorted(listing.splitlines()):
        if not name.lower().endswith(YAML_SUFFIXES):
            continue
        text = _git(Path(top), "show", f"{rev}:{name}")
        sources.extend(read_text_source(text, f"{rev}:{name}", layer))
    if not sources.digests:
        raise UsageError(f"no manifests under {prefix} at git revision {rev}")
    return sources


def _git_task_sources(paths: list[Path], rev: str, manifests: Path) -> Sources:
    """The task files under ``paths`` as they were at ``rev``, each named as its file in
    the work tree (so its project root resolves as the head's does). A file that did not
    exist at ``rev`` is left out: its tasks are new."""
    sources = Sources()
    skip = manifests.resolve()
    for path in paths:
        folder = path if path.is_dir() else path.parent
        try:
            top = Path(_git(folder, "rev-parse", "--show-toplevel").strip()).resolve()
            where = str(path.resolve().relative_to(top)) if path.exists() else ""
        except (subprocess.CalledProcessError, ValueError, OSError):
            raise UsageError(
                f"cannot read {path} at git revision {rev!r}: it is not in a git repository",
                hint="--base compares task files and manifests kept in git",
            ) from None
        if not where:
            continue
        try:
            listing = _git(top, "ls-tree", "-r", "--name-only", rev, "--", where)
        except subprocess.CalledProcessError as exc:
            said = (exc.stderr or "").strip().splitlines()
            raise UsageError(
                f"cannot read {path} at git revision {rev!r}: "
                + (said[0] if said else f"git exited {exc.returncode}")
            ) from None
        for name in sorted(listing.splitlines()):
            file = top / name
            if path.is_dir():  # a folder's YAML files, hidden entries skipped (yaml_files)
                inner = Path(name).relative_to(Path(where)).parts
                if any(part.startswith(".") for part in inner):
                    continue
                if not name.lower().endswith(YAML_SUFFIXES) or file.is_relative_to(skip):
                    continue
            text = _git(top, "show", f"{rev}:{name}")
            sources.extend(read_text_source(text, display_path(file), "task"))
    return sources


def _git(directory: Path, *args: str) -> str:
    cwd = directory if directory.is_dir() else directory.parent
    done = hostproc.run(
        ["git", "-C", str(cwd.resolve()), *args],
        env=hostproc.environment(),
        check=True,
        capture_output=True,
        text=True,
    )
    return str(done.stdout)


def _secrets(sources: Sources) -> list[Diagnostic]:
    """Inline key material: in every parsed value and key, then in each file's text."""
    problems: list[Diagnostic] = []
    by_file: dict[str, list[YamlDoc]] = {}
    seen: dict[str, set[str]] = {}
    for doc in sources.docs:
        found, secrets = inline_secrets(doc)
        problems.extend(found)
        by_file.setdefault(doc.file, []).append(doc)
        seen.setdefault(doc.file, set()).update(secrets)
    for name, text in sources.texts.items():
        problems.extend(text_secrets(name, text, by_file.get(name, []), seen.get(name, set())))
    return problems
