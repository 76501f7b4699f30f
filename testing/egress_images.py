"""The images the egress tests and bench use, built once if missing."""

from __future__ import annotations

from typing import Any

from kagura_agent.membrane import build, images


def _stale_proxy(ref: str) -> bool:
    """The proxy image was built from another recipe than this checkout's (its entry
    script, its Lua module): the tests must exercise this one."""
    found = images.inspect_image(ref)
    if found is None:
        return True
    labels = (found.get("Config") or {}).get("Labels") or {}
    recipe = images.recipes_dir() / "egress-proxy"
    return bool(labels.get(images.LABEL_RECIPE_DIGEST) != images.recipe_digest(recipe))


def ensure_egress_images(client: Any) -> dict[str, str]:
    """Refs of kagura/base (agent and upstreams) and kagura/egress-proxy, building them if
    absent (the proxy also when its recipe changed)."""
    wanted = {"base": images.image_ref("base"), "egress-proxy": images.image_ref("egress-proxy")}
    missing = [name for name, ref in wanted.items() if images.local_image_digest(ref) is None]
    if "egress-proxy" not in missing and _stale_proxy(wanted["egress-proxy"]):
        missing.append("egress-proxy")
    if missing:
        build.build(client, missing, log=lambda _name, _line: None)
    return {"base": wanted["base"], "proxy": wanted["egress-proxy"]}


def this_proxy_image(client: Any) -> str:
    """The ID of a proxy image built from this checkout's recipe, also tagged
    ``kagura/egress-proxy:<version>-<recipe digest>``: checkouts whose recipes differ share
    one daemon and retag ``kagura/egress-proxy:<version>`` under each other's tests, so a
    test that needs this recipe's proxy (its Lua modules) starts it by this ID, or names
    the digest tag in an Image manifest."""
    recipe = images.recipes_dir() / "egress-proxy"
    digest = images.recipe_digest(recipe)
    tag = f"{images.image_ref('egress-proxy')}-{digest.removeprefix('sha256:')[:12]}"
    found = images.inspect_image(tag)
    labels = ((found or {}).get("Config") or {}).get("Labels") or {}
    if found is not None and labels.get(images.LABEL_RECIPE_DIGEST) == digest:
        return str(found["Id"])
    ensure_egress_images(client)  # its parent, kagura/base
    image_id = build.build_one(
        client, "egress-proxy", images.recipes_dir(), log=lambda _name, _line: None
    )
    repository, _, version = tag.rpartition(":")
    client.images.get(image_id).tag(repository, version)
    return image_id


def start_forwarder(container: Any, net: Any) -> None:
    """Start the egress forwarder in a running test container, as apply does."""
    from kagura_agent.membrane.egress.session import start_forwarder as start

    start(container.client, container.id, net)
