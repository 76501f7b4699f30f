"""Durations (90s, 15m, 1h, 7d) and sizes (512m, 2g) as they appear in manifests."""

from __future__ import annotations

_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_BYTES = {"k": 1024, "m": 1024**2, "g": 1024**3}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``15m``; raises ValueError on anything else."""
    unit = text[-1:]
    if unit not in _SECONDS or not text[:-1].isdigit():
        raise ValueError(f"not a duration: {text!r}")
    return int(text[:-1]) * _SECONDS[unit]


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
