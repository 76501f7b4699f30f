"""What a plan says of a named session's brain conversation (``brain.conversation``).

An sdk brain in a container writes its conversation to HOME, a tmpfs that ends with the
run; the host keeps the CLI's transcript of a named session's conversation and nothing
else of HOME (patterns/transcripts.py), and hands it back to the next run's container
before its CLI starts (apply/run/conversation.py). The plan shows both: what is kept, and
what this run gets back. Pure, like the rest of the planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kagura_agent.plan.model import BrainConversation, Plan
from kagura_agent.units import format_size

# The most the host keeps of one session's transcript (a 30-turn coding session's is a few
# MiB; the CLI's first two turns alone write ~180 KiB).
MAX_BYTES = 16 * 1024 * 1024


def conversation(session: str, checkpoint: Mapping[str, Any] | None) -> BrainConversation:
    """``brain.conversation`` of a run of ``session``, whose checkpoint fact (None: none)
    says what is kept of its last conversation: ``conversation`` absent when it had none,
    else ``{"bytes": n}``, n null when it was not kept."""
    last = (checkpoint or {}).get("conversation")
    size = last.get("bytes") if isinstance(last, Mapping) else None
    valid = isinstance(size, int) and not isinstance(size, bool) and size >= 0
    return {
        "session": session,
        "max_bytes": MAX_BYTES,
        "handed_back": size if valid else None,
        "lost": isinstance(last, Mapping) and not valid,
    }


def lines(plan: Plan) -> list[str]:
    """The brain block's lines for the conversation (none when the plan keeps none)."""
    section = plan["brain"].get("conversation")
    if section is None:
        return []
    kept = (
        f"session {section['session']!r}: after the run the host keeps the CLI's transcript"
        f" of its conversation (~/.claude/projects/…/<id>.jsonl, at most"
        f" {format_size(section['max_bytes'])}, the run's secrets scrubbed) and nothing else"
        " of HOME"
    )
    if section["handed_back"] is not None:
        back = (
            "this run's CLI resumes the session's conversation: the transcript kept"
            f" ({format_size(section['handed_back'])}) is written to its HOME before it"
            " starts, nothing else"
        )
    elif section["lost"]:
        back = "the session's last conversation was not kept: this run's CLI starts a new one"
    else:
        back = "this run's CLI starts a new conversation"
    return [kept, back]
