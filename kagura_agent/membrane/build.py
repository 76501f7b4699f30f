"""Build the recipes in images/ through docker-py, in dependency order.

Parents: a recipe whose ``ARG BASE_IMAGE`` default names ``kagura/<name>`` builds on the
image we just built for that recipe; the others (base, egress-proxy) build on
``kagura/bootstrap:bookworm`` when it exists locally (machines with no registry) and on
their digest-pinned upstream default otherwise.

A recipe whose Dockerfile copies ``wheelhouse/`` gets one: ``pip wheel`` of this
checkout (or of the installed package, see source.py) with the agent extras, run on the
host, so the image build needs no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kagura_agent import __version__
from kagura_agent.errors import SetupError, UsageError
from kagura_agent.membrane import images
from kagura_agent.membrane.bootstrap import BOOTSTRAP_REF
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.membrane.source import package_source

WHEELHOUSE_EXTRAS = "claude,brain,aws"
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


def _wheelhouse(target: Path, log: Log, name: str) -> None:
    if sys.version_info[:2] != CONTAINER_PYTHON:
        raise SetupError(
            f"building the {name} image needs Python {'.'.join(map(str, CONTAINER_PYTHON))}"
            f" on the host (its wheels go into Debian bookworm's python3)"
        )
    log(name, f"pip wheel kagura-agent[{WHEELHOUSE_EXTRAS}] into the build context")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(target)]
    # A fixed SOURCE_DATE_EPOCH makes our own wheel byte-identical while the source is
    # unchanged, so the image build's COPY layer (and everything after it) stays cached.
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
    with (
        tempfile.TemporaryDirectory(prefix="kagura-src-") as scratch,
        package_source(Path(scratch)) as root,
    ):
        proc = subprocess.run(
            [*cmd, f"{root}[{WHEELHOUSE_EXTRAS}]"],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-10:])
        raise SetupError(f"pip wheel for the {name} image failed:\n{tail}")


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
        if "wheelhouse/" in (recipe / "Dockerfile").read_text():
            _wheelhouse(context / "wheelhouse", log, name)
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
