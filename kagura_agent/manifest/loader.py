"""Finding and reading manifest and task files into located documents."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from kagura_agent.errors import Diagnostic, UsageError
from kagura_agent.inputfile import Unreadable, read_text
from kagura_agent.manifest.yamlpos import YamlDoc, load_documents
from kagura_agent.paths import resource_dir, workdir

YAML_SUFFIXES = (".yml", ".yaml")
# A manifest or task file is hand-written configuration; anything larger is refused
# before it is read (the largest shipped file is a few KiB).
MAX_FILE_BYTES = 1024 * 1024


def _too_big(name: str, size: int) -> Diagnostic:
    return Diagnostic(
        name,
        1,
        1,
        "$",
        f"file is {size} bytes; manifest and task files are limited to"
        f" {MAX_FILE_BYTES // 1024} KiB",
        "keep large content in the project root and refer to it from the task",
    )


@dataclass
class Sources:
    """Every document read, the sha256 of every file, and the problems found reading them."""

    docs: list[YamlDoc] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    problems: list[Diagnostic] = field(default_factory=list)
    # Which layer each file (by display name) was read as: packaged, operator or task.
    layers: dict[str, str] = field(default_factory=dict)
    # The real path of every file read from disk, so one file is never read twice.
    real_paths: set[str] = field(default_factory=set)
    # Each file's text by display name (the inline-secret check reads comments too).
    texts: dict[str, str] = field(default_factory=dict)

    def extend(self, other: Sources) -> None:
        self.docs.extend(other.docs)
        self.digests.update(other.digests)
        self.problems.extend(other.problems)
        self.layers.update(other.layers)
        self.real_paths.update(other.real_paths)
        self.texts.update(other.texts)


def packaged_dir() -> Path:
    """The packaged default manifest set: the bottom layer of every catalog."""
    return resource_dir("manifests")


def manifests_dir(explicit: str | None) -> Path:
    """The operator's folder: --manifests DIR, else $KAGURA_AGENT_MANIFESTS, else ./manifests.

    With none of these it is the packaged set itself (then there is one layer only).
    """
    for candidate in (explicit, os.environ.get("KAGURA_AGENT_MANIFESTS")):
        if candidate:
            path = Path(candidate)
            if not path.is_dir():
                raise UsageError(f"manifests directory {candidate} {_missing(path)}")
            return path
    # ./manifests of the folder this process works for (a child the host started in a
    # neutral folder reads its parent's: paths.workdir).
    here = workdir()
    local = Path("manifests") if here == Path.cwd() else here / "manifests"
    if local.is_dir():
        return local
    return packaged_dir()


def same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def display_path(path: Path) -> str:
    """Paths under the working directory are shown relative to it (not when that is the
    file system's root, where kagura-agent's own children work: tmp/x would read oddly)."""
    cwd = Path.cwd().resolve()
    try:
        return str(path.resolve().relative_to(cwd)) if cwd != cwd.parent else str(path.resolve())
    except ValueError:
        return str(path.resolve())


def yaml_files(path: Path) -> list[Path]:
    """The YAML files of ``path``; a folder's hidden entries (.github/, .pre-commit-config.yaml,
    .git/) are not ours and are skipped.

    Nothing else in a folder is skipped without a word: symlinked subfolders are read
    (each real folder once, so a loop ends), ``.YML``/``.Yaml`` are YAML files too, and a
    dangling symlink named like one is listed so reading it reports the problem — an
    operator's policy in any of them must never silently stop applying.
    """
    if path.is_dir():
        found: list[Path] = []
        seen: set[str] = set()
        for folder, dirs, files in os.walk(path, followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found += [
                Path(folder) / name
                for name in files
                if not name.startswith(".") and Path(name).suffix.lower() in YAML_SUFFIXES
            ]
        return sorted(found)
    if path.is_file():
        return [path]
    if path.exists():
        raise UsageError(f"{path} is neither a YAML file nor a directory of them")
    raise UsageError(f"{path} {_missing(path)}")


def _missing(path: Path) -> str:
    """Why ``path`` is no folder or file to read: absent, a symlink that leads nowhere (a
    loop, a dangling target), unreachable, or something else."""
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a symlink to {os.readlink(path)!r}, which does not exist"
        return "does not exist"
    except OSError as exc:  # ELOOP, EACCES, ENOTDIR
        return f"cannot be read: {exc.strerror}"
    return "is not a directory"


def packaged_display(path: Path) -> str:
    """A packaged file's name: relative to the working directory when under it, else
    ``<packaged>/NAME`` (so plans do not depend on where the tool is installed)."""
    shown = display_path(path)
    if not Path(shown).is_absolute():
        return shown
    try:
        return "<packaged>/" + str(path.resolve().relative_to(packaged_dir().resolve()))
    except ValueError:
        return shown


def read_text_source(text: str, name: str, layer: str = "operator") -> Sources:
    sources = Sources()
    sources.layers[name] = layer
    data = text.encode("utf-8", "surrogateescape")
    sources.digests[name] = "sha256:" + hashlib.sha256(data).hexdigest()
    if len(data) > MAX_FILE_BYTES:
        sources.problems.append(_too_big(name, len(data)))
        return sources
    docs, problems = load_documents(text, name)
    sources.texts[name] = text
    sources.docs.extend(docs)
    sources.problems.extend(problems)
    return sources


def read_paths(
    paths: list[Path], layer: str = "operator", *, skip: set[str] | None = None
) -> Sources:
    """Read every YAML file under ``paths`` as ``layer``; files whose real path is in
    ``skip`` (already read as another layer) are not read again."""
    sources = Sources()
    done = set(skip or ())
    for path in paths:
        for file in yaml_files(path):
            real = os.path.realpath(file)
            if real in done:
                continue
            done.add(real)
            sources.real_paths.add(real)
            name = packaged_display(file) if layer == "packaged" else display_path(file)
            try:
                text = read_text(file, MAX_FILE_BYTES)
            except Unreadable as exc:
                # A symlink is shown by its target: name the link the folder holds too.
                link = f" ({file})" if real != os.path.abspath(file) else ""
                problem = (
                    _too_big(name, exc.too_big)
                    if exc.too_big
                    else Diagnostic(name, 1, 1, "$", f"cannot read file: {exc.reason}{link}")
                )
                sources.problems.append(problem)
                continue
            sources.extend(read_text_source(text, name, layer))
    return sources
