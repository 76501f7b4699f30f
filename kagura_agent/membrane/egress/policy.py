"""The plan's ``egress`` section, checked and normalised into an :class:`EgressPolicy`.

Pure: no Docker, no DNS, no clock. Anything this module cannot make exact is refused
with a RefusedError, so a run whose allowlist cannot be enforced never starts.

Semantics (the squid configuration and the audit matcher both follow them):

- ``host`` is an exact DNS name, or ``*.domain``: any name *below* ``domain`` (any depth)
  but not ``domain`` itself. IP literals are refused; so are wildcards over a single
  label (``*.com``).
- ``port`` defaults to 443. ``scheme`` defaults to ``https``: only ``CONNECT host:port``
  passes. ``scheme: http`` allows plain proxied HTTP (no CONNECT) to that port.
- A name is refused when it resolves to a loopback, private, link-local, shared,
  reserved or cloud-metadata address, unless that entry's own ``allow_addresses`` covers
  the range. The same holds for the Docker host's own addresses (``EgressPolicy.host``,
  gathered at apply by hostaddrs.py): a public one lies in no range. An exception never
  spreads: it holds for its entry's host only. The section's ``allow_addresses`` (the
  union the planner lists for reviewers) is not enforcement input.
- Host names go through the same normaliser as validate and plan
  (``kagura_agent.manifest.hosts``); a plan whose host is not already in its normal form
  (hand-edited, or from another version) is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kagura_agent.errors import RefusedError
from kagura_agent.manifest.hosts import normalize_host

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Destinations a listed name may not resolve to unless explicitly allowed. Metadata
# services live inside these: 169.254.169.254 (AWS/GCP/Azure), 100.100.100.200
# (Alibaba, shared space), 192.0.0.192 (Oracle), fd00:ec2::254 (AWS IPv6, ULA).
FORBIDDEN_RANGES: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)

_ENTRY_KEYS = {"host", "port", "scheme", "policy", "source", "layer", "allow_addresses"}
# "pool" says whether a warm session may serve the run (pool.py); it changes no rule.
# "proxy" is the image the proxy runs (plan egress.proxy), not part of the allowlist.
# model_calls: the key-injecting port's policy (modelport.ModelCallPolicy reads it).
_SECTION_KEYS = {"mode", "allow", "allow_addresses", "policies", "pool", "proxy", "model_calls"}
_SCHEMES = ("https", "http")


@dataclass(frozen=True)
class AllowEntry:
    """One allowlist entry: who may be reached, on which port, how."""

    host: str  # the name as written: "api.github.com" or "*.example.com"
    port: int = 443
    scheme: str = "https"
    policy: str = ""
    source: str = ""
    allow_addresses: tuple[Network, ...] = ()

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    @property
    def domain(self) -> str:
        """The name without the wildcard prefix."""
        return self.host[2:] if self.wildcard else self.host

    def label(self) -> str:
        """How the audit names this entry: ``host:port/scheme``."""
        return f"{self.host}:{self.port}/{self.scheme}"

    def matches_host(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        if self.wildcard:
            return name.endswith("." + self.domain) and len(name) > len(self.domain) + 1
        return name == self.host

    def matches(self, host: str, port: int, connect: bool) -> bool:
        """True when a request for ``host:port`` (CONNECT or plain HTTP) is this entry's."""
        wanted_connect = self.scheme == "https"
        return self.matches_host(host) and port == self.port and connect == wanted_connect


@dataclass(frozen=True)
class EgressPolicy:
    """The enforceable form of a plan's egress section."""

    mode: str
    entries: tuple[AllowEntry, ...] = ()
    # The Docker host's own addresses (hostaddrs.py), refused like a forbidden range: a
    # public one is in no range, and the proxy runs on that host.
    host: tuple[Network, ...] = ()

    def on_host(self, addresses: Iterable[Network]) -> EgressPolicy:
        """This policy, also refusing ``addresses`` (the host the proxy runs on)."""
        return replace(self, host=tuple(addresses))

    def match(self, host: str, port: int, connect: bool) -> AllowEntry | None:
        """The first entry that allows this request, or None (default deny)."""
        for entry in self.entries:
            if entry.matches(host, port, connect):
                return entry
        return None

    def forbidden_for(self, entry: AllowEntry) -> list[Network]:
        """Forbidden ranges and the host's own addresses, minus what this entry (and only
        this entry) explicitly allows."""
        ranges = [ipaddress.ip_network(r) for r in FORBIDDEN_RANGES]
        own = [a for a in self.host if not any(_within(a, r) for r in ranges)]
        return subtract([*ranges, *own], entry.allow_addresses)


def _within(net: Network, outer: Network) -> bool:
    return net.version == outer.version and net.subnet_of(outer)  # type: ignore[arg-type]


def subtract(ranges: Iterable[Network], allowed: Iterable[Network]) -> list[Network]:
    """``ranges`` with every address in ``allowed`` removed, as a minimal list of networks."""
    remaining = list(ranges)
    for hole in allowed:
        next_round: list[Network] = []
        for net in remaining:
            if net.version != hole.version or not net.overlaps(hole):
                next_round.append(net)
            elif net.subnet_of(hole):  # type: ignore[arg-type]
                continue
            else:
                next_round.extend(net.address_exclude(hole))  # type: ignore[arg-type]
        remaining = next_round
    return sorted(remaining, key=lambda n: (n.version, n.network_address, n.prefixlen))


def _networks(value: Any, where: str, problems: list[str]) -> tuple[Network, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(f"{where}: must be a list of CIDR ranges")
        return ()
    result = []
    for item in value:
        try:
            result.append(ipaddress.ip_network(str(item), strict=True))
        except ValueError as exc:
            problems.append(f"{where}: {item!r} is not a CIDR range ({exc})")
    return tuple(result)


def _entry(raw: Any, where: str, problems: list[str]) -> AllowEntry | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: must be a mapping")
        return None
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        problems.append(f"{where}: unknown keys {unknown}")
    host = raw.get("host")
    if not isinstance(host, str) or not host:
        problems.append(f"{where}.host: required string")
        return None
    normal, why = normalize_host(host)
    if normal is None:
        problems.append(f"{where}.host: {why}")
        return None
    if normal != host and normal != host.lower().removesuffix("."):
        problems.append(f"{where}.host: {host!a} is not in normal form ({normal!r}); plan again")
        return None
    host = normal
    port = raw.get("port", 443)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        problems.append(f"{where}.port: {port!r} is not a port number 1-65535")
        port = 443
    scheme = raw.get("scheme", "https")
    if scheme not in _SCHEMES:
        problems.append(f"{where}.scheme: {scheme!r} must be one of {list(_SCHEMES)}")
    return AllowEntry(
        host=host,
        port=port,
        scheme=str(scheme),
        policy=str(raw.get("policy") or ""),
        source=str(raw.get("source") or ""),
        allow_addresses=_networks(raw.get("allow_addresses"), f"{where}.allow_addresses", problems),
    )


def load_policy(egress: Mapping[str, Any] | None) -> EgressPolicy:
    """Check the plan's ``egress`` section; raise RefusedError listing every problem."""
    section: Mapping[str, Any] = egress or {"mode": "none"}
    problems: list[str] = []
    unknown = sorted(set(section) - _SECTION_KEYS)
    if unknown:
        problems.append(f"egress: unknown keys {unknown}")
    mode = section.get("mode", "none")
    if mode not in ("none", "proxy"):
        problems.append(f"egress.mode: {mode!r} must be 'none' or 'proxy'")
    allow = section.get("allow") or []
    if not isinstance(allow, list):
        problems.append("egress.allow: must be a list")
        allow = []
    entries = [_entry(raw, f"egress.allow[{i}]", problems) for i, raw in enumerate(allow)]
    _networks(section.get("allow_addresses"), "egress.allow_addresses", problems)
    if problems:
        raise RefusedError(
            "the plan's egress allowlist cannot be enforced:\n  " + "\n  ".join(problems),
            hint="fix the egress manifest and plan again",
        )
    return EgressPolicy(mode=str(mode), entries=tuple(e for e in entries if e))
