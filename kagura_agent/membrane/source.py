"""A source tree of kagura-agent for ``pip wheel`` (the agent image installs it).

From a checkout, a copy of what the build reads (the package, the top-level data folders,
the top-level files) in a temporary folder: a build writes build/ and *.egg-info into its
source, and two builds of one folder at once (two image builds, a wheel test) remove each
other's files. From an installed wheel there is no checkout, so a minimal project is
written into a temporary folder: the installed package (with its packaged schemas,
manifests and recipes) plus a pyproject.toml carrying the installed distribution's own
version, dependencies and extras, read from its metadata.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from kagura_agent import __version__
from kagura_agent.paths import PACKAGE_DIR, repo_root


@contextmanager
def package_source(scratch: Path) -> Iterator[Path]:
    """Yield a folder ``pip wheel`` can build kagura-agent from."""
    root = repo_root()
    project = scratch / "kagura-agent-src"
    project.mkdir(parents=True)
    if root is not None:
        yield _checkout_copy(root, project)
        return
    shutil.copytree(
        PACKAGE_DIR,
        project / "kagura_agent",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    (project / "pyproject.toml").write_text(pyproject_text(_requirements()))
    yield project


# What setup.py and pyproject.toml read from a checkout, besides its top-level files.
CHECKOUT_FOLDERS = ("kagura_agent", "schemas", "manifests", "images", "requirements")
_NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc", "wheelhouse")


def _checkout_copy(root: Path, project: Path) -> Path:
    for entry in root.iterdir():
        if entry.is_file() and not entry.is_symlink():
            shutil.copy2(entry, project / entry.name)
    for folder in CHECKOUT_FOLDERS:
        shutil.copytree(root / folder, project / folder, ignore=_NOT_SOURCE)
    return project


def _requirements() -> list[str]:
    try:
        return list(metadata.requires("kagura-agent") or [])
    except metadata.PackageNotFoundError:
        return []


def pyproject_text(requires: list[str]) -> str:
    """pyproject.toml for the installed package, from its ``Requires-Dist`` lines."""
    plain: list[str] = []
    extras: dict[str, list[str]] = {}
    for line in requires:
        requirement, _, marker = line.partition(";")
        marker = marker.strip()
        if marker.startswith("extra =="):
            extra = marker.split("==", 1)[1].strip().strip("\"'")
            extras.setdefault(extra, []).append(requirement.strip())
        elif not marker:
            plain.append(requirement.strip())
    lines = [
        "[build-system]",
        'requires = ["setuptools>=68", "wheel"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        'name = "kagura-agent"',
        f"version = {json.dumps(__version__)}",
        'requires-python = ">=3.11"',
        f"dependencies = {json.dumps(plain)}",
        "",
        "[project.optional-dependencies]",
        *(f"{json.dumps(name)} = {json.dumps(reqs)}" for name, reqs in sorted(extras.items())),
        "",
        "[tool.setuptools.packages.find]",
        'include = ["kagura_agent*"]',
        "",
        "[tool.setuptools.package-data]",
        'kagura_agent = ["py.typed", "data/**/*"]',
        "",
    ]
    return "\n".join(lines)
