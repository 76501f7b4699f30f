"""Where the host may send a root secret: provider endpoints from the operator's manifests.

A provider endpoint (``endpoint``, ``revoke_endpoint`` in a CredentialProvider's
settings) is a plain ``https://HOST[:PORT][/path]`` URL: no user info, no query, no
fragment. The host never sends a root secret to a loopback, private, link-local
(cloud metadata), shared or otherwise non-public address unless the provider's own
manifest lists that address in ``endpoint_addresses`` — the operator saying "this
address is the provider's" (a local fake in tests, a private STS endpoint). Plain
``http`` is accepted only for such a declared address.

``endpoint_problems`` is pure (validate and plan use it); ``check_endpoints`` also
resolves the host names and is called right before a root secret is read to talk to a
provider (lease broker and sweeper).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from kagura_agent.errors import RefusedError

ENDPOINT_KEYS = ("endpoint", "revoke_endpoint")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


def declared_networks(settings: Mapping[str, Any]) -> tuple[list[IPNetwork], list[str]]:
    """The ``endpoint_addresses`` networks, and a message for each entry that is not one."""
    networks: list[IPNetwork] = []
    bad: list[str] = []
    for entry in settings.get("endpoint_addresses") or []:
        try:
            networks.append(ipaddress.ip_network(str(entry), strict=False))
        except ValueError:
            bad.append(f"endpoint_addresses entry {entry!r} is not an address or CIDR range")
    return networks, bad


def _public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def _declared(address: IPAddress, networks: list[IPNetwork]) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address.version == n.version and address in n for n in networks)


def endpoint_problems(settings: Mapping[str, Any]) -> dict[str, str]:
    """Static problems of each endpoint in ``settings`` (key → message); no DNS."""
    networks, bad = declared_networks(settings)
    problems: dict[str, str] = {}
    if bad:
        problems["endpoint_addresses"] = "; ".join(bad)
    for key in ENDPOINT_KEYS:
        url = settings.get(key)
        if not url:
            continue
        message = _url_problem(str(url), networks)
        if message:
            problems[key] = message
    return problems


def _url_problem(url: str, networks: list[IPNetwork]) -> str | None:
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return "not a URL"
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host:
        return "must be https://HOST[:PORT][/PATH]"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "must not carry user info"
    if parts.query or parts.fragment:
        return "must not carry a query or fragment"
    literal = _literal(host)
    if literal is not None and not _public(literal) and not _declared(literal, networks):
        return (
            f"{host} is not a public address; list it in endpoint_addresses if it really"
            " is the provider's"
        )
    if parts.scheme == "http" and not networks:
        return "must be https (plain http only for an address listed in endpoint_addresses)"
    return None


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def check_endpoints(settings: Mapping[str, Any], resolver: Resolver = _getaddrinfo) -> None:
    """Refuse (RefusedError) before a root secret goes to an endpoint it must not reach.

    Every address the host name resolves to must be public or declared; a name that does
    not resolve is refused too (the SDK would resolve it again, maybe differently).
    """
    found = endpoint_problems(settings)
    if found:
        key, message = sorted(found.items())[0]
        raise RefusedError(
            f"provider {key} refused: {message}",
            hint="provider endpoints come from the operator's CredentialProvider manifest",
        )
    networks, _ = declared_networks(settings)
    for key in ENDPOINT_KEYS:
        url = settings.get(key)
        if not url:
            continue
        parts = urllib.parse.urlsplit(str(url))
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            addresses = resolver(host, port)
        except OSError as exc:
            raise RefusedError(f"provider {key} {host} does not resolve: {exc}") from None
        for text in addresses:
            address = ipaddress.ip_address(text.split("%")[0])
            if not _public(address) and not _declared(address, networks):
                raise RefusedError(
                    f"provider {key} {host} resolves to {address}, which is not public:"
                    " the root secret is not sent there",
                    hint="if that address really is the provider's, list it in the"
                    " provider's endpoint_addresses",
                )
