"""ToolServer manifests: MCP tool servers the operator declares and tasks request by name.

Two transports. ``stdio``: the agent's CLI starts ``command`` inside the agent container,
so the command must come from an image variant the operator declares (``image``); a task
using the server runs in that image. ``http``: the CLI connects to ``url`` through the
run's egress proxy, so the url's host and port join the run's allowlist (plan
``egress.allow`` with ``policy: toolserver:<name>``).

Only the sdk engine hands tool servers to its CLI, and only inside a container (a host
run has no image and no proxy): any other brain is a validate error at the task's
``spec.tool_servers``, located, never a silent drop.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from kagura_agent.errors import Diagnostic
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.hosts import normalize_host

# The sdk engine's own in-process MCP servers (brain/engines/sdk.py MEMORY_SERVER,
# brain/dispatch_tool.py DISPATCH_SERVER): a tool server may not take their names.
RESERVED_NAMES = ("kagura-memory", "kagura-dispatch")
STDIO_ONLY = ("image", "command", "args", "env")
HTTP_ONLY = ("url", "allow_addresses")


@dataclass(frozen=True)
class Endpoint:
    """An http tool server's url, split the way the egress allowlist needs it."""

    scheme: str
    host: str
    port: int


def endpoint(url: str) -> tuple[Endpoint | None, str]:
    """``(Endpoint, "")`` for an acceptable url, else ``(None, problem)``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return None, f"{url!r} is not a valid url: {exc}"
    if parts.scheme not in ("http", "https"):
        return None, f"{url!r}: the scheme must be http or https"
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None, f"{url!r}: no user info, query or fragment (keys never go in a manifest)"
    host, problem = normalize_host(parts.hostname or "")
    if host is None:
        return None, problem
    if host.startswith("*."):
        return None, f"{url!r}: a tool server's host must be one exact name, not a wildcard"
    default = 443 if parts.scheme == "https" else 80
    return Endpoint(parts.scheme, host, port or default), ""


def check_tool_server(manifest: Manifest, catalog: Catalog) -> list[Diagnostic]:
    """Cross-field checks the schema cannot say: keys of the other transport, the image
    reference, the url's host and the address ranges."""
    spec = manifest.spec
    problems: list[Diagnostic] = []
    if manifest.name in RESERVED_NAMES:
        problems.append(
            manifest.diag(
                ("metadata", "name"),
                f"{manifest.name!r} is the name of one of the brain's own MCP servers",
                hint="give the tool server another name",
            )
        )
    transport = spec["transport"]
    other = HTTP_ONLY if transport == "stdio" else STDIO_ONLY
    for key in other:
        if key in spec:
            problems.append(
                manifest.diag(
                    ("spec", key),
                    f"{key} does not apply to a {transport} tool server",
                    key=True,
                )
            )
    if transport == "stdio" and "image" in spec and catalog.get("Image", spec["image"]) is None:
        problems.append(
            manifest.diag(
                ("spec", "image"),
                f"unknown Image {spec['image']!r}",
                hint="known Image names: " + (", ".join(catalog.names("Image")) or "(none)"),
            )
        )
    if transport == "http" and "url" in spec:
        _, problem = endpoint(spec["url"])
        if problem:
            problems.append(manifest.diag(("spec", "url"), problem))
        for index, cidr in enumerate(spec.get("allow_addresses", [])):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                problems.append(
                    manifest.diag(
                        ("spec", "allow_addresses", index),
                        f"{cidr!r} is not an address range",
                        hint="use CIDR such as 10.0.0.0/8",
                    )
                )
    return problems


@dataclass(frozen=True)
class ToolServerRequest:
    """What a task's ``spec.tool_servers`` resolved to."""

    servers: tuple[Manifest, ...]
    image: Manifest | None  # the stdio servers' image, when the task must run in it


def resolve_tool_servers(
    task: Manifest,
    catalog: Catalog,
    *,
    brain: Manifest | None,
    runtime: str,
    problems: list[Diagnostic],
) -> ToolServerRequest:
    """The task's tool servers by name; every problem located at ``spec.tool_servers``."""
    names = task.spec.get("tool_servers", [])
    servers: list[Manifest] = []
    for index, name in enumerate(names):
        found = catalog.get("ToolServer", name)
        if found is None:
            problems.append(
                task.diag(
                    ("spec", "tool_servers", index),
                    f"unknown ToolServer {name!r}",
                    hint="known ToolServer names: "
                    + (", ".join(catalog.names("ToolServer")) or "(none)")
                    + "; tool servers are declared in the operator's manifests",
                )
            )
        else:
            servers.append(found)
    if not names:
        return ToolServerRequest((), None)
    at = ("spec", "tool_servers")
    if brain is not None and brain.spec["engine"] != "sdk":
        problems.append(
            task.diag(
                at,
                f"brain {brain.name!r} is the {brain.spec['engine']} engine, which cannot use"
                " tool servers; only the sdk engine hands them to its CLI",
                hint="use a Brain with engine: sdk, or drop spec.tool_servers",
            )
        )
    if runtime != "container":
        problems.append(
            task.diag(
                at,
                "tool servers need runtime: container (a stdio server runs in the agent's"
                " image, an http one is reached through the run's proxy)",
            )
        )
    return ToolServerRequest(tuple(servers), _stdio_image(task, catalog, servers, problems))


def _stdio_image(
    task: Manifest, catalog: Catalog, servers: list[Manifest], problems: list[Diagnostic]
) -> Manifest | None:
    """The one image every stdio server runs in (and the task, when it names another)."""
    images = {s.spec["image"]: s for s in servers if s.spec["transport"] == "stdio"}
    if not images:
        return None
    if len(images) > 1:
        problems.append(
            task.diag(
                ("spec", "tool_servers"),
                "stdio tool servers from different images cannot run in one container: "
                + ", ".join(f"{s.name} ({image})" for image, s in sorted(images.items())),
            )
        )
        return None
    [(name, server)] = images.items()
    asked = task.spec.get("image")
    if asked is not None and asked != name:
        problems.append(
            task.diag(
                ("spec", "image"),
                f"tool server {server.name!r} runs over stdio in image {name!r}; this task"
                f" names image {asked!r}",
                hint=f"set spec.image: {name}, or leave it out",
            )
        )
        return None
    return catalog.get("Image", name)
