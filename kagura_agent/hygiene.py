"""Output hygiene: what text from inputs may reach an operator's screen, a CI log or a chat.

File names, directory names, manifest values and whatever an agent wrote are data an
attacker may control. Two things are done to them before any renderer prints them:

- ``neutralise`` makes control characters visible instead of acting on them: C0 and C1
  controls, DEL, and the Unicode bidirectional overrides and isolates (which reorder
  text on screen) become ``\\xNN`` / ``\\uNNNN`` escapes, so an ANSI sequence in a
  directory name cannot recolour, erase or hide lines from a reviewer;
- ``redact_secrets`` replaces anything shaped like key material (the same patterns the
  inline-secret check uses) so an error message never echoes a pasted key.

Every renderer calls ``neutralise`` (plan text and markdown on the plan data, the
cockpit on each message, ``Diagnostic`` and ``KaguraError`` on their fields).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED_SECRET = "(redacted: looks like a secret)"

# C0 controls but \t and \n, DEL, C1 controls, bidi embeddings/overrides/isolates, and
# the line/paragraph separators some terminals and chat clients treat as newlines.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
_UNSAFE_IN_LINE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def neutralise(text: str, *, newlines: bool = True) -> str:
    """``text`` with every control character shown as an escape.

    With ``newlines=False`` a newline and a tab are escaped too: for a value that is
    printed inside one line (a name, a path), where a newline could forge a line.
    """
    pattern = _UNSAFE if newlines else _UNSAFE_IN_LINE
    return pattern.sub(_escape, text) if pattern.search(text) else text


# The frame of every line of text the agent wrote (what it said, its tools' output, the
# output of the verify commands it may have written) wherever it is shown: the live view
# (with colour or without), a CI log, a chat thread. None of kagura-agent's own lines
# begins with it (they begin with a time, an indent or a mark of their own: ●, ▸, ✓, ⚠, …),
# and text framed by ``agent_lines`` cannot end its frame: every line break in it starts
# a new framed line, and no control character survives (see ``agent_lines``).
AGENT_MARK = "┃ "


def agent_lines(text: str) -> list[str]:
    """``text`` the agent wrote, as lines that cannot pass for kagura-agent's own: split
    at every line break (``\n``, ``\r``, the Unicode separators ``str.splitlines``
    knows), each piece neutralised for one line (no control character, tab or bidi
    override left to act) and begun with ``AGENT_MARK``."""
    return [AGENT_MARK + neutralise(line, newlines=False) for line in text.splitlines() or [""]]


def json_text(text: str) -> str:
    """A JSON document's text with each character ``neutralise`` would escape written as a
    JSON ``\\u`` escape instead: the same data for any parser, but nothing a terminal acts
    on and no line break a line reader splits at. (``json.dumps`` with ``ensure_ascii=False``
    escapes C0 controls but leaves DEL, the C1 controls — CSI among them — bidi overrides
    and U+2028/U+2029 raw.) A JSON document's own whitespace (newline, space) stays."""
    return _UNSAFE.sub(_json_escape, text) if _UNSAFE.search(text) else text


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def neutralise_data(value: Any) -> Any:
    """A copy of a JSON-like value with every string (keys too) neutralised for one line."""
    if isinstance(value, str):
        return neutralise(value, newlines=False)
    if isinstance(value, dict):
        return {neutralise_data(k): neutralise_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [neutralise_data(item) for item in value]
    return value


# Inline key material: (label, pattern). Prefixes are the providers' published formats.
# Every pattern must scan in linear time: a bounded repeat, or an unbounded one that can
# start only once per run of its characters (tests/test_input_bounds.py times each).
SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("an Anthropic API key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}")),
    # Not an Anthropic key's start: a truncated one is no key of either kind.
    ("an OpenAI-style API key", re.compile(r"\bsk-(?!ant-)(?:proj-)?[A-Za-z0-9_\-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("a Slack app token", re.compile(r"\bxapp-[A-Za-z0-9\-]{10,}")),
    ("a GitHub token", re.compile(r"\b(?:ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{30,}")),
    ("a GitHub fine-grained token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}")),
    ("a private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
    ("a Google OAuth access token", re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}")),
    (
        # Anchored at the start of a run (not at any "eyJ" inside one, e.g. after "-"):
        # otherwise each start rescans the rest of the run and the scan is quadratic.
        "a JSON web token",
        re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\."),
    ),
    (
        # Cloudflare tokens are bare 40-char strings: only flag them when keyed as such.
        "a Cloudflare API token",
        re.compile(
            r"(?i)(?:cloudflare|cf)[_\-]?(?:api)?[_\-]?(?:token|key)\W{0,3}[A-Za-z0-9_\-]{40}\b"
        ),
    ),
    (
        "an AWS secret access key",
        re.compile(r"(?i)aws.{0,20}secret.{0,20}\W[A-Za-z0-9/+=]{40}\b"),
    ),
)

# A bare token with no known prefix: long, no spaces, upper and lower case and digits.
# Used only for values echoed from a document (a schema error), not for whole messages,
# where it would also catch ordinary path components.
_TOKENISH = re.compile(r"^[A-Za-z0-9_\-+/=.]{24,}$")


def looks_like_secret(value: str) -> str | None:
    """Name the kind of key material ``value`` contains inline, or None."""
    for label, pattern in SECRET_PATTERNS:
        if pattern.search(value):
            return label
    return None


def looks_like_token(value: str) -> bool:
    """Known key material, or a long mixed-case alphanumeric run with digits."""
    if looks_like_secret(value):
        return True
    return bool(
        _TOKENISH.match(value)
        and re.search(r"[a-z]", value)
        and re.search(r"[A-Z]", value)
        and re.search(r"[0-9]", value)
    )


def redact_secrets(text: str) -> str:
    """``text`` with every substring shaped like known key material replaced."""
    for _, pattern in SECRET_PATTERNS:
        if pattern.search(text):
            text = pattern.sub(REDACTED_SECRET, text)
    return text


# A password given as a keyword (``?password=…`` or libpq's ``password=…``).
_PASSWORD_KEYWORD = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def url_without_password(url: str) -> str:
    """``url`` for messages, its password shown as ``***`` however it is written: a
    proper URL, one without its scheme (``user:pw@db:5432/k``, where urlsplit sees no
    user at all), or a password keyword. Everything between the user's ``:`` and the
    last ``@`` is the password: a ``/`` or ``@`` in it is masked too."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{host}"
    return _PASSWORD_KEYWORD.sub(r"\1***", scheme + sep + rest)
