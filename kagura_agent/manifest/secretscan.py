"""Key material in a manifest or task file: what the inline-secret check finds, and how.

Manifests hold references to secrets (``env:NAME``, ``file:PATH``, ``keyring:S/U``), never
values. ``scan`` looks for the known key formats (hygiene.SECRET_PATTERNS: AWS, Anthropic,
OpenAI-style, Slack, GitHub, Google, JSON web tokens, private keys, keyed Cloudflare and
AWS secret keys) in a text, and also:

- after removing invisible characters (Unicode format characters such as the zero-width
  space, joiners, the BOM, soft hyphens and tags, and the other default-ignorable ones:
  variation selectors, Hangul fillers) and folding look-alikes with NFKC (fullwidth
  letters, U+FF53 for s), so a key padded or spelt with them is still one;
- inside base64 (standard or URL-safe, 24 characters or more), hex (32 digits or more)
  and percent-encoding, decoded up to two levels deep;
- across a break: a line break with its indentation, a list dash, a ``#`` and the quotes
  around it removed, or the ``", "`` between two items of a flow list (``scan_joined``);
- the start of a key whose rest is elsewhere: a key format's prefix followed by at least
  8 key characters, with a digit or both cases among them, where the whole key is not.

Not found, by construction: a value in no known format (a password, a bare 40-character
token nobody named), a key split so that no piece keeps its prefix and 8 characters, or
kept apart by other text, or hidden any other way (encrypted, compressed, reversed, rot13,
assembled by a script at run time). docs/authority.md says the same, with the examples
tests/test_secret_scan.py runs. Pure, and linear in the text (every pattern scans in
linear time; each decoding is bounded by the text it decodes).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote

from kagura_agent.hygiene import SECRET_PATTERNS

FRAGMENT = "the start of one (the rest elsewhere?)"
MAX_DEPTH = 2  # base64 of base64 is found; a third layer is not looked into
# Default-ignorable code points outside category Cf (which is removed whole).
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{24,}={0,2}")
_HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}){16,}(?![0-9A-Fa-f])")
# A word with a percent-escape in it; it can start only at a word's start, so the scan is
# linear (a word without one is walked once).
_PERCENT_WORD = re.compile(r"(?<!\S)\S*?%[0-9A-Fa-f]{2}\S*")
# A line break or a flow list's ", " with what surrounds it in YAML: quotes, a line
# continuation, indentation, a list dash, a comment mark.
_JOINT = re.compile(r"""["'\\]?[ \t]*(?:\r?\n[ \t]*(?:-[ \t]+|\#[ \t]*)?|,[ \t]*)["']?""")
# The start of each key format and its characters: a piece that starts like a key.
_FRAGMENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)([A-Z0-9]{8,})")),
    ("an Anthropic API key", re.compile(r"\bsk-ant-([A-Za-z0-9_\-]{8,})")),
    ("an OpenAI-style API key", re.compile(r"\bsk-(?!ant-)(?:proj-)?([A-Za-z0-9_\-]{8,})")),
    ("a Slack token", re.compile(r"\bxox[abposr]-([A-Za-z0-9\-]{8,})")),
    ("a Slack app token", re.compile(r"\bxapp-([A-Za-z0-9\-]{8,})")),
    ("a GitHub token", re.compile(r"\b(?:ghp|gho|ghs|ghu|ghr)_([A-Za-z0-9]{8,})")),
    ("a GitHub fine-grained token", re.compile(r"\bgithub_pat_([A-Za-z0-9_]{8,})")),
    ("a Google API key", re.compile(r"\bAIza([0-9A-Za-z_\-]{8,})")),
    ("a Google OAuth access token", re.compile(r"\bya29\.([0-9A-Za-z_\-]{8,})")),
    ("a JSON web token", re.compile(r"(?<![A-Za-z0-9_\-])eyJ([A-Za-z0-9_\-]{8,})")),
)


@dataclass(frozen=True)
class Finding:
    """Key material at ``offset`` of the scanned text. ``how`` says how it was hidden
    ("" when written plainly); ``secret`` is the material as found (to tell one finding
    from another; never printed)."""

    kind: str
    how: str
    offset: int
    secret: str

    @property
    def fragment(self) -> bool:
        return FRAGMENT in self.how

    def describe(self) -> str:
        return f"{self.kind}, {self.how}" if self.how else self.kind


class Offsets:
    """Where each character of a derived text came from in the original: identity
    stretches kept as (derived start, original start) pairs, so the map costs nothing for
    plain ASCII and stays small for text with a few odd characters."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._origins: list[int] = []

    def add(self, derived: int, original: int) -> None:
        self._starts.append(derived)
        self._origins.append(original)

    def __getitem__(self, derived: int) -> int:
        i = bisect.bisect_right(self._starts, derived) - 1
        return self._origins[i] + (derived - self._starts[i]) if i >= 0 else 0


def normalise(text: str) -> tuple[str, Offsets]:
    """``text`` without invisible characters and NFKC-folded (one character at a time),
    with the offset in ``text`` each character of the result comes from."""
    where = Offsets()
    where.add(0, 0)
    if text.isascii():
        return text, where
    out: list[str] = []
    size = last = 0
    for odd in _NON_ASCII.finditer(text):
        plain = text[last : odd.start()]
        out.append(plain)
        size += len(plain)
        char = odd[0]
        if unicodedata.category(char) != "Cf" and not _IGNORABLE.match(char):
            folded = unicodedata.normalize("NFKC", char)
            where.add(size, odd.start())
            out.append(folded)
            size += len(folded)
        last = odd.end()
        where.add(size, last)
    out.append(text[last:])
    return "".join(out), where


def scan(text: str) -> list[Finding]:
    """Every key found in ``text`` (see the module docstring), one finding a place: the
    first pattern that matches there (an Anthropic key is not also an OpenAI-style one)."""
    found: dict[int, Finding] = {}
    for finding in _scan(text, 0):
        found.setdefault(finding.offset, finding)
    return sorted(found.values(), key=lambda f: f.offset)


def scan_joined(text: str, seen: set[str]) -> list[Finding]:
    """Keys broken across lines or flow-list items: ``text`` scanned with every joint
    (``_JOINT``) removed; what ``seen`` (the secrets found otherwise) holds is left out."""
    pieces: list[str] = []
    where = Offsets()
    size = last = 0
    for match in _JOINT.finditer(text):
        where.add(size, last)
        pieces.append(text[last : match.start()])
        size += match.start() - last
        last = match.end()
    if not pieces:
        return []
    where.add(size, last)
    pieces.append(text[last:])
    return [
        Finding(f.kind, _also(f.how, "split across lines"), where[f.offset], f.secret)
        for f in scan("".join(pieces))
        # Two words that meet at a break are not a key: a key's characters are random.
        if f.secret not in seen and (f.kind == "a private key" or _keyish(f.secret))
    ]


def _also(how: str, more: str) -> str:
    return ", ".join(part for part in (how, more) if part)


def _scan(text: str, depth: int) -> Iterator[Finding]:
    clean, where = normalise(text)
    hidden = clean != text
    whole: list[tuple[int, int]] = []
    for label, pattern in SECRET_PATTERNS:
        for match in pattern.finditer(clean):
            whole.append(match.span())
            start = where[match.start()]
            plain = not hidden or text[start : start + len(match[0])] == match[0]
            how = "" if plain else "hidden with invisible or look-alike characters"
            yield Finding(label, how, start, match[0])
    covered = _Covered(whole)
    for label, pattern in _FRAGMENTS:
        for match in pattern.finditer(clean):
            if match.start() in covered or not _keyish(match[1]):
                continue
            yield Finding(label, FRAGMENT, where[match.start()], match[0])
    if depth >= MAX_DEPTH:
        return
    # Every decoded run of one encoding is scanned in one text (a line each): one pass,
    # however many runs — a finding is placed at the start of its run.
    runs: dict[str, tuple[list[str], list[int], list[int]]] = {}
    for how, start, decoded in _decodings(clean):
        texts, starts, origins = runs.setdefault(how, ([], [], []))
        starts.append(sum(len(t) + 1 for t in texts[-1:]) + (starts[-1] if starts else 0))
        texts.append(decoded)
        origins.append(where[start])
    for how, (texts, starts, origins) in runs.items():
        for inner in _scan("\n".join(texts), depth + 1):
            origin = origins[bisect.bisect_right(starts, inner.offset) - 1]
            yield Finding(inner.kind, _also(how, inner.how), origin, inner.secret)


class _Covered:
    """Offsets inside any of some spans, looked up in log time (spans merged first)."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self._starts = [m[0] for m in merged]
        self._ends = [m[1] for m in merged]

    def __contains__(self, offset: int) -> bool:
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]


def _keyish(body: str) -> bool:
    """A digit, or both cases: a random key's characters, not a word's (sk-learn-tools)."""
    return any(c.isdigit() for c in body) or (body.lower() != body and body.upper() != body)


def _decodings(clean: str) -> Iterator[tuple[str, int, str]]:
    """(how, offset in ``clean``, decoded text) for each encoded run worth a look."""
    for match in _BASE64_RUN.finditer(clean):
        run = match[0].rstrip("=")
        altchars = b"-_" if ("-" in run or "_" in run) else None
        try:
            raw = base64.b64decode(run + "=" * (-len(run) % 4), altchars=altchars, validate=True)
        except (binascii.Error, ValueError):
            continue
        if text := _as_text(raw):
            yield "base64-encoded", match.start(), text
    for match in _HEX_RUN.finditer(clean):
        if text := _as_text(bytes.fromhex(match[0])):
            yield "hex-encoded", match.start(), text
    for match in _PERCENT_WORD.finditer(clean):
        try:
            decoded = unquote(match[0], errors="strict")
        except UnicodeDecodeError:
            continue
        yield "percent-encoded", match.start(), decoded


def _as_text(raw: bytes) -> str:
    """``raw`` as text when it is text (UTF-8, few control characters), else ""."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return text if len(_CONTROL.findall(text)) <= len(text) // 10 else ""
