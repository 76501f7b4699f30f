"""Terminal styling: colour only on a TTY, never when NO_COLOR is set."""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

_CODES = {
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "bold": "1",
    "dim": "2",
}


class Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO) -> Style:
        if os.environ.get("NO_COLOR"):
            return cls(False)
        isatty = getattr(stream, "isatty", None)
        return cls(bool(isatty and isatty()))

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


def stdout_style() -> Style:
    return Style.for_stream(sys.stdout)


def quote(text: str, limit: int = 500) -> str:
    """``text`` as a bounded JSON string literal: shown as data, never as markup or an
    instruction (quotes, newlines, escapes and non-ASCII are escaped)."""
    clipped = text if len(text) <= limit else text[:limit] + "..."
    return json.dumps(clipped, ensure_ascii=True)
