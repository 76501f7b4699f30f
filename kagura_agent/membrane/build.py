"""Build the recipes in images/ through docker-py, in dependency order.

Parents: a recipe whose ``ARG BASE_IMAGE`` default names ``kagura/<name>`` builds on the
image we just built for that recipe; the others (base, egress-proxy) build on
``kagura/bootstrap:bookworm`` when it exists locally (machines with no registry) and on
their digest-pinned upstream default otherwise.

A recipe whose Dockerfile copies ``wheelhouse/`` gets one, made on the host so the image
build needs no network: every dependency of the agent extras exactly as the lock
(requirements/agent.txt) pins and hashes it, plus a wheel of this checkout (or of the
installed package, see source.py). The image is labelled with the brain software it
bakes (SDK, bundled CLI) and the lock's digest.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kagura_agent import __version__, hostproc
from kagura_agent.errors import SetupError, UsageError
from kagura_agent.membrane import images
from kagura_agent.membrane.bootstrap import BOOTSTRAP_REF
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.membrane.source import package_source

# The images' python3 is Debian bookworm's 3.11; compiled wheels must match its ABI.
CONTAINER_PYTHON = (3, 11)

Log = Callable[[str, str], None]


def build_order(names: list[str], directory: Path) -> list[str]:
    """``names`` plus any parent recipe not built locally yet, parents first."""
    known = images.recipe_names(directory)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no recipe images/{unknown[0]}/Dockerfile (have: {', '.join(known)})")
    wanted = set(names or known)
    for name in list(wanted):
        parent = images.parent_recipe(directory / name)
        while parent and images.local_image_digest(images.image_ref(parent)) is None:
            wanted.add(parent)
            parent = images.parent_recipe(directory / parent)
    return [n for n in known if n in wanted]


def _parent_ref(recipe: Path, upstream: bool) -> str:
    parent = images.parent_recipe(recipe)
    if parent:
        return images.image_ref(parent)
    if not upstream and images.local_image_digest(BOOTSTRAP_REF):
        return BOOTSTRAP_REF
    return images.base_image_default(recipe)


def _wheelhouse(target: Path, log: Log, name: str) -> dict[str, str]:
    """Fill ``target`` with the locked wheels and this kagura-agent; return the brain
    software it holds (name -> version) for the image's label."""
    if sys.version_info[:2] != CONTAINER_PYTHON:
        raise SetupError(
            f"building the {name} image needs Python {'.'.join(map(str, CONTAINER_PYTHON))}"
            f" on the host (its wheels go into Debian bookworm's python3)"
        )
    lock = images.lock_file()
    if not lock.is_file():
        raise SetupError(f"no dependency lock at {lock} (a broken install? reinstall)")
    log(name, f"pip wheel the locked dependencies ({lock.name}) into the build context")
    # Every dependency at the version and hash the lock records, as published wheels
    # only: nothing unlocked is built or fetched.
    _pip_wheel(
        ["--require-hashes", "--only-binary", ":all:", "-r", str(lock)],
        target,
        f"pip wheel of the locked dependencies for the {name} image",
    )
    log(name, "pip wheel kagura-agent itself into the build context")
    # A fixed SOURCE_DATE_EPOCH makes our own wheel byte-identical while the source is
    # unchanged, so the image build's COPY layer (and everything after it) stays cached.
    # The locked build backend builds it when it is installed (scripts/install.sh).
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    with (
        tempfile.TemporaryDirectory(prefix="kagura-src-") as scratch,
        package_source(Path(scratch)) as root,
    ):
        _pip_wheel(
            ["--no-deps", *isolation, str(root)],
            target,
            f"pip wheel of kagura-agent for the {name} image",
            env={"SOURCE_DATE_EPOCH": "315532800"},
        )
    return wheelhouse_software(target)


def _pip_wheel(args: list[str], target: Path, what: str, env: dict[str, str] | None = None) -> None:
    # Isolated and in the file system's root (hostproc): ``-m pip`` would otherwise import
    # pip, and all it imports, from the folder the operator ran the build in first.
    cmd = hostproc.python_module_argv("pip", "wheel", "-q", "--wheel-dir", str(target), *args)
    proc = hostproc.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        env=hostproc.environment(env),
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-10:])
        raise SetupError(f"{what} failed:\n{tail}")


# Wheels whose version the image's label (and so the plan) shows.
SHOWN_SOFTWARE = ("claude-agent-sdk", "kagura-brain", "kagura-agent")


def wheelhouse_software(wheelhouse: Path) -> dict[str, str]:
    """The shown packages' versions in a wheelhouse, plus ``claude-code``: the version of
    the Claude Code CLI the SDK's wheel bundles (its ``_cli_version.py``)."""
    found: dict[str, str] = {}
    for wheel in sorted(wheelhouse.glob("*.whl")):
        dist, version = wheel.name.split("-")[:2]
        project = dist.lower().replace("_", "-")
        if project not in SHOWN_SOFTWARE:
            continue
        found[project] = version
        if project == "claude-agent-sdk":
            cli = _bundled_cli_version(wheel)
            if cli:
                found["claude-code"] = cli
    return found


def _bundled_cli_version(wheel: Path) -> str | None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            text = archive.read("claude_agent_sdk/_cli_version.py").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    match = re.search(r"""__cli_version__\s*=\s*["']([^"']+)["']""", text)
    return match.group(1) if match else None


def build_one(client: Any, name: str, directory: Path, *, log: Log, upstream: bool = False) -> str:
    """Build ``images/<name>`` as ``kagura/<name>:<version>``; return the image ID."""
    recipe = directory / name
    parent = _parent_ref(recipe, upstream)
    labels = {
        images.LABEL_RECIPE: name,
        images.LABEL_RECIPE_DIGEST: images.recipe_digest(recipe),
        images.LABEL_PARENT: images.local_image_digest(parent) or parent,
        images.LABEL_VERSION: __version__,
    }
    with tempfile.TemporaryDirectory(prefix=f"kagura-build-{name}-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(recipe, context, ignore=shutil.ignore_patterns("wheelhouse"))
        if images.uses_wheelhouse(recipe):
            software = _wheelhouse(context / "wheelhouse", log, name)
            labels[images.LABEL_SOFTWARE] = json.dumps(software, sort_keys=True)
            labels[images.LABEL_LOCK_DIGEST] = images.lock_digest() or ""
            log(name, "bakes " + ", ".join(f"{k} {v}" for k, v in sorted(software.items())))
        log(name, f"building {images.image_ref(name)} on {parent}")
        with docker_errors(f"building {images.image_ref(name)}"):
            stream = client.api.build(
                path=str(context),
                tag=images.image_ref(name),
                buildargs={"BASE_IMAGE": parent},
                labels=labels,
                rm=True,
                forcerm=True,
                decode=True,
            )
            image_id = _follow(stream, name, log)
    return image_id


def _follow(stream: Any, name: str, log: Log) -> str:
    image_id = ""
    recent: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            detail = "\n".join(recent[-15:])
            raise SetupError(f"building the {name} image failed: {chunk['error']}\n{detail}")
        text = str(chunk.get("stream") or chunk.get("status") or "")
        for line in text.splitlines():
            if line.strip():
                recent.append(line)
                log(name, line)
        aux = chunk.get("aux") or {}
        image_id = str(aux.get("ID") or image_id)
    if not image_id:
        raise SetupError(f"building the {name} image produced no image ID")
    return image_id


def build(
    client: Any,
    names: list[str],
    *,
    log: Log,
    directory: Path | None = None,
    upstream: bool = False,
) -> list[dict[str, Any]]:
    """Build ``names`` (all recipes when empty) and missing parents, in order.

    Returns one ``{"name", "ref", "id", "seconds"}`` row per built image.
    """
    directory = directory or images.recipes_dir()
    built = []
    for name in build_order(names, directory):
        started = time.monotonic()
        image_id = build_one(client, name, directory, log=log, upstream=upstream)
        seconds = round(time.monotonic() - started, 1)
        log(name, f"built {images.image_ref(name)} {image_id[:19]} in {seconds}s")
        built.append(
            {"name": name, "ref": images.image_ref(name), "id": image_id, "seconds": seconds}
        )
    return built
