"""Egress host names: normalised (lowercase, no trailing dot, IDNA) and checked."""

from __future__ import annotations

import ipaddress
import re

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def normalize_host(text: str) -> tuple[str | None, str]:
    """Return ``(host, "")`` for an acceptable entry, else ``(None, problem)``.

    Accepted: exact names and explicit ``*.domain`` wildcards. Refused: IP literals,
    ``*`` alone, wildcards anywhere but the first label, ports in the host field.
    """
    raw = text.strip()
    if not raw:
        return None, "empty host"
    if raw == "*" or raw == "*.":
        return None, "'*' alone would allow every host; list hosts or use *.example.com"
    if _is_ip_literal(raw):
        return None, f"{raw!r} is an IP literal; egress entries must be host names"
    if "://" in raw or "/" in raw:
        return None, f"{raw!r} is not a host name (no scheme or path)"
    if ":" in raw:
        return None, f"{raw!r} contains a port; put ports in the entry's ports list"
    wildcard = raw.startswith("*.")
    body = raw[2:] if wildcard else raw
    if "*" in body:
        return None, f"{raw!r}: wildcards are only allowed as the first label (*.example.com)"
    body = body.rstrip(".").lower() if body.endswith(".") else body.lower()
    try:
        ascii_name = body.encode("idna").decode("ascii")
    except UnicodeError:
        return None, f"{raw!r} is not a valid host name"
    labels = ascii_name.split(".")
    if any(not _LABEL.match(label) for label in labels):
        return None, f"{raw!r} is not a valid host name"
    if wildcard and len(labels) < 2:
        return None, f"{raw!r}: a wildcard must cover a domain with at least two labels"
    return ("*." if wildcard else "") + ascii_name, ""


def _is_ip_literal(text: str) -> bool:
    candidate = text.strip("[]")
    try:
        ipaddress.ip_address(candidate)
        return True
    except ValueError:
        pass
    # Integer and dotted forms that resolvers accept as addresses (e.g. 2130706433, 0x7f.1).
    return bool(
        re.fullmatch(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}", candidate.lower())
    )
