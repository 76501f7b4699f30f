"""Fake ``claude`` and ``codex`` executables that speak the real CLI contracts offline."""

from __future__ import annotations

from pathlib import Path

FAKE_DIR = Path(__file__).resolve().parent
FAKE_CLAUDE = FAKE_DIR / "claude"
FAKE_CODEX = FAKE_DIR / "codex"
