"""The ``runs`` table's schema, now owned by the state package (state/history.py); kept
here for apply's modules until apply/ is laid out in role folders."""

from __future__ import annotations

from kagura_agent.state.history import MIGRATIONS

__all__ = ["MIGRATIONS"]
