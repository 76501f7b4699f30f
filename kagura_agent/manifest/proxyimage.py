"""Which egress proxy image a plan pins, and where it is pushed.

The proxy is built from images/egress-proxy and tagged ``kagura/egress-proxy:<version>``.
An operator who runs plans on several Docker hosts adds an Image manifest built from that
recipe with a ``repository``: ``kagura-agent images push NAME`` pushes it there, and plans
pin ``egress.proxy`` (its ID and ``repository@sha256:…``) as they pin the agent image.
Read by the facts (what to look up) and the planner (what to write).
"""

from __future__ import annotations

from dataclasses import dataclass

from kagura_agent.manifest.catalog import Catalog
from kagura_agent.membrane.images import image_ref

PROXY_RECIPE = "images/egress-proxy"


@dataclass(frozen=True)
class ProxyImage:
    tag: str
    repository: str | None


def proxy_image(catalog: Catalog) -> ProxyImage:
    """The first Image manifest built from images/egress-proxy, else the packaged tag."""
    for image in catalog.of("Image"):
        if image.spec["recipe"] == PROXY_RECIPE:
            return ProxyImage(image.spec["tag"], image.spec.get("repository"))
    return ProxyImage(image_ref("egress-proxy"), None)
