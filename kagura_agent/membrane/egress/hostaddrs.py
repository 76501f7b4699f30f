"""The Docker host's own addresses, which no listed name may resolve to.

``policy.FORBIDDEN_RANGES`` covers loopback, private, link-local and reserved space. A
host whose interface has an address outside them (a cloud VM's public address, a lab's
TEST-NET address) is not covered: a listed name resolving to that address (DNS
rebinding) reached every service the host binds on 0.0.0.0, through the proxy, which
runs on that host. So each run's proxy also refuses the host's own addresses, entry by
entry, like a forbidden range (an entry's own ``allow_addresses`` still decides for it).

Read where the daemon is: this machine's interfaces (Linux: ``/proc/net/fib_trie`` and
``/proc/net/if_inet6``, a fraction of a millisecond) when ``DOCKER_HOST`` is a Unix
socket; the addresses of the daemon's host name when it is ``tcp://`` or ``ssh://``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from kagura_agent.membrane.egress.policy import Network

_FIB_TRIE = Path("/proc/net/fib_trie")
_IF_INET6 = Path("/proc/net/if_inet6")


def docker_host_addresses(docker_host: str | None = None) -> tuple[Network, ...]:
    """The addresses of the host the daemon (and so the proxy) runs on, one network each."""
    where = docker_host if docker_host is not None else os.environ.get("DOCKER_HOST", "")
    if not where or where.startswith(("unix://", "npipe://", "fd://")):
        return _networks([*_local_ipv4(), *_local_ipv6()])
    return _networks(_resolved(urlsplit(where).hostname or ""))


def _networks(addresses: Iterable[str]) -> tuple[Network, ...]:
    found = set()
    for address in addresses:
        try:
            found.add(ipaddress.ip_network(address.split("%")[0]))
        except ValueError:
            continue
    return tuple(sorted(found, key=lambda n: (n.version, n.network_address)))


def _local_ipv4() -> list[str]:
    """Addresses the kernel delivers locally: ``|-- A.B.C.D`` followed by ``/32 host LOCAL``."""
    try:
        lines = _FIB_TRIE.read_text().splitlines()
    except OSError:
        return []
    return [
        lines[i - 1].split()[-1]
        for i, line in enumerate(lines)
        if i > 0 and "/32 host LOCAL" in line and lines[i - 1].split()
    ]


def _local_ipv6() -> list[str]:
    try:
        lines = _IF_INET6.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if fields and len(fields[0]) == 32:
            found.append(str(ipaddress.IPv6Address(int(fields[0], 16))))
    return found


def _resolved(name: str) -> list[str]:
    if not name:
        return []
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]
