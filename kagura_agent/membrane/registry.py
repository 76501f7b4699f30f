"""Images by digest through a registry: push what was built, pull what a plan pins.

``push`` tags a local image into its Image manifest's ``repository`` and pushes it; the
registry answers with the manifest digest, and ``repository@sha256:…`` is what plans pin
(``image.pull``). ``pull_pinned`` runs on the applying host before the plan is checked:
when a pinned image ID is not here it pulls ``image.pull`` (and the egress proxy's
``egress.proxy.pull``) by digest and refuses (exit 6) unless exactly the pinned ID arrived. A pull never moves a local tag.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kagura_agent.errors import RefusedError
from kagura_agent.membrane.images import image_present, inspect_image, repo_digest
from kagura_agent.membrane.runtime import ContainerError, connect, docker_errors
from kagura_agent.plan.model import Plan

Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


def push(ref: str, repository: str, *, client: Any | None = None, log: Log = _quiet) -> str:
    """Push the local image ``ref`` to ``repository``; returns ``repository@sha256:…``."""
    own = client is None
    client = client if client is not None else connect(timeout=1800)
    try:
        found = inspect_image(ref)
        if found is None:
            raise RefusedError(f"image {ref} is not built here", hint="kagura-agent images build")
        tag = ref.rpartition(":")[2]
        started = time.monotonic()
        with docker_errors(f"tagging {ref} as {repository}:{tag}"):
            client.api.tag(found["Id"], repository, tag)
        log(f"pushing {repository}:{tag} ({found['Id'][:19]})")
        with docker_errors(f"pushing {repository}:{tag}"):
            for event in client.api.push(repository, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise RefusedError(f"push of {repository}:{tag} failed: {event['error']}")
        pushed = repo_digest(inspect_image(found["Id"]) or {}, repository)
        if pushed is None:
            raise RefusedError(f"push of {repository}:{tag} reported no digest")
        log(f"pushed {pushed} in {time.monotonic() - started:.1f}s")
        return pushed
    finally:
        if own:
            client.close()


def pull_pinned(plan: Plan, *, client: Any | None = None, log: Log = _quiet) -> bool:
    """Make the plan's pinned images present here (the agent image, and the egress proxy
    image of ``egress.proxy``); True when one had to be pulled.

    Nothing to do for host-runtime plans, unresolved images (apply refuses those later)
    or an image already here. Refuses (exit 6) when an image is missing and the plan
    names nowhere to pull it from, or when the pull brought another image ID.
    """
    if plan["brain"]["runtime"] != "container":
        return False
    image, proxy = plan["image"], plan["egress"].get("proxy")
    wanted = [(f"image {image['ref']}", image["digest"], image["pull"])]
    if proxy:
        wanted.append((f"egress proxy image {proxy['ref']}", proxy["digest"], proxy["pull"]))
    # A missing image with nowhere to pull it from: check_image_digest / check_proxy_digest
    # refuse it, naming what this host has instead.
    missing = [(what, d, p) for what, d, p in wanted if d and p and not image_present(d)]
    if not missing:
        return False
    own = client is None
    client = client if client is not None else connect(timeout=1800)
    try:
        for what, digest, pull in missing:
            _pull(client, what, digest, pull, log)
        return True
    finally:
        if own:
            client.close()


def _pull(client: Any, what: str, digest: str, pull: str, log: Log) -> None:
    started = time.monotonic()
    log(f"pulling {pull}")
    try:
        with docker_errors(f"pulling {pull}"):
            client.api.pull(pull)
    except ContainerError as exc:
        raise RefusedError(
            f"{what} differs on this Docker host (the plan pins {digest})"
            f" and could not be pulled: {exc.message}",
            hint="is the registry up, and was the image pushed there?",
        ) from exc
    found = inspect_image(pull)
    got = found["Id"] if found else None
    if got != digest:
        raise RefusedError(
            f"{what} differs: {pull} is {got} here, the plan pins {digest}",
            hint="plan again to review the image the registry has",
        )
    log(f"pulled {pull} in {time.monotonic() - started:.1f}s")
