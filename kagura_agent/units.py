"""Durations (90s, 15m, 1h, 7d, 1d12h) and sizes (512m, 2g) as they appear in manifests."""

from __future__ import annotations

import re

_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
# Units largest first, each at most once: "1d12h", never "12h1d".
_DURATION = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_BYTES = {"k": 1024, "m": 1024**2, "g": 1024**3}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``15m`` or ``1d12h``; raises ValueError otherwise."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"not a duration: {text!r}")
    return sum(
        int(count) * size
        for count, size in zip(match.groups(), _SECONDS.values(), strict=True)
        if count is not None
    )


def format_duration(seconds: int | float) -> str:
    """The shortest exact form: 900 → 15m, 3600 → 1h, 90 → 90s."""
    value = int(seconds)
    for unit in ("d", "h", "m"):
        size = _SECONDS[unit]
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return f"{value}s"


def parse_size(text: str) -> int:
    unit = text[-1:].lower()
    if unit not in _BYTES or not text[:-1].isdigit():
        raise ValueError(f"not a size: {text!r}")
    return int(text[:-1]) * _BYTES[unit]


def format_size(size: int) -> str:
    """Bytes as the largest whole binary unit: 1073741824 → ``1 GiB``, 1536 → ``1.5 KiB``."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"
