"""A registry and a second Docker host for the tests, started by the project's scripts.

``registry`` runs Debian's docker-registry on 127.0.0.1 (scripts/registry-up.sh);
``second_daemon`` runs a second dockerd in a network namespace of its own, with iptables,
the registry's port forwarded onto its loopback (scripts/dockerd2-up.sh). Both are started
once per session (tests/conftest.py), because pushing the agent image to a fresh registry
costs minutes. ``KAGURA_DOCKERD2_DIR`` names a second daemon that outlives the session.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resources import missing

ROOT = Path(__file__).resolve().parent.parent


def script(name: str, *args: str) -> str:
    """Run scripts/NAME; its stdout (stripped), or a missing resource with its stderr."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        missing(f"scripts/{name} failed: {done.stderr[-1500:]}")
    return done.stdout.strip()


def registry() -> Iterator[str]:
    """HOST:PORT of a docker-registry for the session."""
    if os.geteuid() != 0:
        missing("the registry and the second dockerd are started as root here")
    # Not under pytest's tmp dirs: the registry runs as its own user, who cannot enter
    # pytest's private folders.
    folder = Path(tempfile.mkdtemp(prefix="kagura-registry-"))
    address = script("registry-up.sh", str(folder))
    try:
        yield address
    finally:
        script("registry-up.sh", "--stop", str(folder))
        shutil.rmtree(folder, ignore_errors=True)


def second_daemon(folder: Path, registry: str) -> Iterator[Any]:
    """A docker-py client of the second daemon; ``.host`` is its DOCKER_HOST and
    ``.netns`` the path of its network namespace."""
    import docker

    shared = os.environ.get("KAGURA_DOCKERD2_DIR")
    folder = Path(shared) if shared else folder
    host = script("dockerd2-up.sh", str(folder), registry)
    client = docker.DockerClient(base_url=host, timeout=120)
    client.host = host
    client.netns = netns_path(folder)
    try:
        yield client
    finally:
        client.close()
        if not shared:
            script("dockerd2-up.sh", "--stop", str(folder))


def netns_path(folder: Path) -> str:
    """/run/netns/NAME of the second daemon started in ``folder`` (as dockerd2-up.sh names it)."""
    resolved = os.path.realpath(folder)
    return "/run/netns/kagura-d2-" + hashlib.sha256(resolved.encode()).hexdigest()[:10]


def in_netns(netns: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the second daemon's network namespace only (nsenter --net)."""
    return subprocess.run(
        ["nsenter", f"--net={netns}", *argv], capture_output=True, text=True, **kwargs
    )
