"""Egress host names: the one normaliser that validate, plan and the proxy config share.

``normalize_host`` either returns the exact ASCII name squid will be configured with, or a
problem to report at validate. Whatever it accepts is safe to write into squid.conf:
lowercase ASCII letters, digits, ``-`` and ``.`` only (plus a leading ``*.``).

Refused, each with its own message: empty names, whitespace or control characters anywhere
(a newline would end a squid.conf line), IP literals in any form resolvers accept
(``127.0.0.1.``, ``2130706433``, ``0x7f.1``, ``[::1]``), characters that IDNA would
silently fold into something else (zero-width characters, fullwidth digits, ideographic
full stops — the name the reviewer reads must be the name that is enforced), numeric
top-level labels, names over 253 characters, ports, schemes, paths and misplaced ``*``, and
wildcards over a public suffix (``*.co.uk``, ``*.github.io``: the Public Suffix List the
``publicsuffixlist`` package ships, loaded only when a wildcard is checked).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import unicodedata
from functools import cache
from typing import Any

from kagura_agent.manifest.cache import PassCache, key

MAX_NAME = 253
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_ASCII_NAME = re.compile(r"(\*\.)?[a-z0-9.-]{1,253}")
_NUMERIC = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?")
# Label separators IDNA 2003 maps to "." (ideographic, fullwidth, halfwidth full stops).
_FOREIGN_DOTS = "\u3002\uff0e\uff61"


def normalize_host(text: str) -> tuple[str | None, str]:
    """Return ``(host, "")`` for an acceptable entry, else ``(None, problem)``.

    Accepted: exact names and explicit ``*.domain`` wildcards; letters are lowercased, one
    trailing dot is dropped and internationalised names become their ``xn--`` form.
    """
    if not isinstance(text, str) or not text:
        return None, "empty host"
    shown = ascii(text) if not text.isascii() or not text.isprintable() else repr(text)
    if len(text) > MAX_NAME + 3:
        return None, f"host is {len(text)} characters; a DNS name has at most {MAX_NAME}"
    bad = next((c for c in text if not c.isprintable() or c.isspace()), None)
    if bad is not None:
        return None, f"{shown} contains whitespace, a control or an invisible character ({bad!a})"
    if text in ("*", "*."):
        return None, "'*' alone would allow every host; list hosts or use *.example.com"
    if is_ip_literal(text):
        return None, f"{shown} is an IP literal; egress entries must be host names"
    if "://" in text or "/" in text:
        return None, f"{shown} is not a host name (no scheme or path)"
    if ":" in text:
        return None, f"{shown} contains a port; put ports in the entry's ports list"
    wildcard = text.startswith("*.")
    body = text[2:] if wildcard else text
    if "*" in body:
        return None, f"{shown}: wildcards are only allowed as the first label (*.example.com)"
    problem = _unicode_problem(body, shown)
    if problem:
        return None, problem
    body = body.lower()
    body = body[:-1] if body.endswith(".") else body
    try:
        name = body.encode("idna").decode("ascii")
    except UnicodeError:
        return None, f"{shown} is not a valid host name"
    if len(name) > MAX_NAME:
        return None, f"{shown} is {len(name)} characters long; a DNS name has at most {MAX_NAME}"
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return None, f"{shown} is not a valid host name (letters, digits, '-', dot-separated)"
    if labels[-1].isdigit():
        return None, f"{shown}: its last label is numeric, which resolvers read as an address"
    if is_ip_literal(name):
        return None, f"{shown} is an IP literal; egress entries must be host names"
    if wildcard and len(labels) < 2:
        return None, f"{shown}: a wildcard must cover a domain with at least two labels"
    if wildcard and is_public_suffix(name):
        return None, (
            f"{shown} covers the public suffix {name}: every registrant's domain under it"
            " (name the domain instead, e.g. *.example." + name + ")"
        )
    host = ("*." if wildcard else "") + name
    assert is_squid_safe(host)
    return host, ""


@cache
def _suffix_list() -> Any:
    # Imported on first use: only a wildcard entry pays for loading the list (~80 ms).
    from publicsuffixlist import PublicSuffixList

    # The snapshot shipped inside the package, ICANN and private sections (github.io,
    # s3.amazonaws.com are suffixes too); it never fetches anything.
    return PublicSuffixList(only_icann=False)


def is_public_suffix(name: str) -> bool:
    """True when ``name`` is on the Public Suffix List (co.uk, github.io, com, ...).

    A name found *not* to be a suffix is remembered in the pass cache, keyed on the
    shipped list file's identity, so a plan over the same wildcards does not load the
    list again; a suffix is always checked.
    """
    identity = _list_identity()
    passed = PassCache("suffix-pass")
    item = key("public-suffix", identity, name) if identity else ""
    if item and item in passed:
        return False
    public = bool(_suffix_list().is_public(name))
    if item and not public:
        passed.add(item)
    return public


def _list_identity() -> str:
    """The shipped list file's path, size and mtime (found without importing it)."""
    spec = importlib.util.find_spec("publicsuffixlist")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        try:
            found = os.stat(os.path.join(folder, "public_suffix_list.dat"))
        except OSError:
            continue
        return f"{folder}:{found.st_size}:{found.st_mtime_ns}"
    return ""


def _unicode_problem(body: str, shown: str) -> str:
    """Refuse non-ASCII characters that IDNA would fold silently into other characters."""
    if body.isascii():
        return ""
    for char in body:
        if char.isascii():
            continue
        if char in _FOREIGN_DOTS:
            return f"{shown} uses {char!a} as a dot; write '.'"
        if unicodedata.category(char)[0] not in "LM":
            return f"{shown} contains {char!a}, which is not a letter (digits must be ASCII)"
        if unicodedata.normalize("NFKC", char) != char:
            return f"{shown} contains {char!a}, a compatibility form of another character"
    return ""


def is_ip_literal(host: str) -> bool:
    """True for anything a resolver would take as an address (also ``[::1]``, ``0x7f.1``)."""
    text = host.strip("[]")
    text = text[:-1] if text.endswith(".") else text
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    # inet_aton accepts 2130706433, 0x7f.1, 017700000001: numeric-only names are never DNS.
    return bool(_NUMERIC.fullmatch(text.lower()))


def is_squid_safe(host: str) -> bool:
    """True when ``host`` may be written into squid.conf as is (the renderer asserts it)."""
    return bool(_ASCII_NAME.fullmatch(host)) and ".." not in host
