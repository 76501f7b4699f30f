"""The brain conversation of a named session, kept by the host between its runs.

The Claude Code CLI resumes a session (``--resume ID``) from one file it wrote: its
transcript, ``~/.claude/projects/<working directory>/<ID>.jsonl`` (measured on the bundled
CLI: a HOME holding that file and nothing else resumes; without it the CLI answers "No
conversation found"). A container's HOME is a tmpfs that ends with the run, so the host
keeps that one file for the session and hands it back to the next run's container before
its CLI starts (apply/run/conversation.py). Nothing else of HOME is kept: no settings, hooks,
plugins, memory files, credentials or other sessions' transcripts.

The transcript is the agent's writing (the model's words, every tool's output): untrusted
bytes. The host never runs it and reads it only as text, to scrub the run's secrets
(apply/run/conversation.py); here it is stored compressed, bounded:

    max_bytes  the most one transcript may hold (uncompressed; more is not kept at all)
    per_owner  transcripts kept per session owner (task kind + project root, as a
               checkpoint's); the least recently saved goes first
    total      transcripts kept in all, likewise

One row per session (the session's name, as a checkpoint), bound to its owner: another
owner naming the same session reads nothing.

Before it is kept, :func:`check_transcript` holds the text to the shape the CLI writes: one
JSON object per line, each of this session (a ``sessionId`` other than the conversation's
is another session's entry planted in it). It reads the text as data and takes nothing
from it: the session's budgets, spending and leases are the host's checkpoint's
(patterns/checkpoint.py), the CLI's permission mode and budgets its next run's flags.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from kagura_agent.clock import Clock, SystemClock, iso, parse_iso
from kagura_agent.state import Connection, StateStore

COMPONENT = "transcripts"
MIGRATIONS = (
    """
    CREATE TABLE transcripts (
      session TEXT PRIMARY KEY,
      owner TEXT NOT NULL,
      brain_session_id TEXT NOT NULL,
      size INTEGER NOT NULL,
      data BLOB NOT NULL,
      saved TEXT NOT NULL
    );
    """,
)


@dataclass(frozen=True)
class TranscriptLimits:
    """How much of the agents' conversations the host keeps (``max_bytes``: the plan's
    ``brain.conversation.max_bytes``)."""

    max_bytes: int
    per_owner: int = 8
    total: int = 64


@dataclass(frozen=True)
class KeptTranscript:
    """What is kept of one session's conversation (``data``: the transcript as handed back)."""

    session: str
    owner: Mapping[str, str]
    brain_session_id: str
    size: int
    saved: datetime
    data: bytes = b""


class TranscriptTooLarge(ValueError):
    """A transcript over the limit: it is not kept."""


class TranscriptRejected(ValueError):
    """A transcript that is not what the CLI writes (the message says where): not kept."""


def check_transcript(text: str, brain_session_id: str) -> int:
    """The number of entries of ``text``, the CLI's transcript of ``brain_session_id``;
    TranscriptRejected, naming the first line that is not one JSON object of that session
    (or nests too deep to read), or for a transcript with no entry at all."""
    count = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except RecursionError:
            raise TranscriptRejected(f"line {number} nests too deep to be read") from None
        except ValueError:
            raise TranscriptRejected(f"line {number} is not JSON") from None
        if not isinstance(entry, dict):
            raise TranscriptRejected(f"line {number} is not a JSON object")
        named = entry.get("sessionId", brain_session_id)
        if named != brain_session_id:
            shown = json.dumps(named)[:60]
            raise TranscriptRejected(
                f"line {number} is an entry of another session ({shown}), not {brain_session_id}"
            )
        count += 1
    if not count:
        raise TranscriptRejected("the transcript holds no entry")
    return count


def _migrated(state: StateStore) -> StateStore:
    state.migrate(COMPONENT, MIGRATIONS)
    return state


def _owner_text(owner: Mapping[str, str]) -> str:
    return json.dumps(dict(owner), sort_keys=True)


def keep_transcript(
    state: StateStore,
    kept: KeptTranscript,
    *,
    limits: TranscriptLimits,
    clock: Clock | None = None,
) -> list[str]:
    """Keep ``kept.data`` as the session's conversation (replacing what it had); returns the
    sessions whose transcripts went to stay within the limits."""
    if len(kept.data) > limits.max_bytes:
        raise TranscriptTooLarge(
            f"the transcript holds {len(kept.data)} bytes, more than the {limits.max_bytes}"
            " the host keeps"
        )
    saved = iso((clock or SystemClock()).now())
    owner = _owner_text(kept.owner)
    packed = zlib.compress(kept.data, 6)
    with _migrated(state).transaction() as conn:
        conn.execute(
            "INSERT INTO transcripts(session, owner, brain_session_id, size, data, saved)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session) DO UPDATE SET"
            " owner = excluded.owner, brain_session_id = excluded.brain_session_id,"
            " size = excluded.size, data = excluded.data, saved = excluded.saved",
            (kept.session, owner, kept.brain_session_id, len(kept.data), packed, saved),
        )
        evicted = _beyond(conn, kept.session, "AND owner = ?", (owner,), limits.per_owner)
        evicted += _beyond(conn, kept.session, "", (), limits.total)
        for session in dict.fromkeys(evicted):
            conn.execute("DELETE FROM transcripts WHERE session = ?", (session,))
    return list(dict.fromkeys(evicted))


def _beyond(
    conn: Connection, kept: str, where: str, params: tuple[str, ...], keep: int
) -> list[str]:
    """Sessions other than ``kept`` (just saved, so never one of them) past the ``keep``
    most recently saved of the rows ``where`` selects."""
    sql = f"SELECT session FROM transcripts WHERE session != ? {where} ORDER BY saved DESC, session"
    rows = conn.execute(sql, (kept, *params)).fetchall()
    return [str(row["session"]) for row in rows[max(keep - 1, 0) :]]


def load_transcript(
    state: StateStore, session: str, owner: Mapping[str, str]
) -> KeptTranscript | None:
    """The session's kept conversation when ``owner`` kept it, else None."""
    return transcript_info(state, session, owner, with_data=True)


def transcript_info(
    state: StateStore,
    session: str,
    owner: Mapping[str, str],
    *,
    with_data: bool = False,
) -> KeptTranscript | None:
    """What is kept of the session's conversation for ``owner`` (its data only with
    ``with_data``); None when nothing is, or another owner kept it."""
    columns = "owner, brain_session_id, size, saved" + (", data" if with_data else "")
    row = (
        _migrated(state)
        .conn.execute(f"SELECT {columns} FROM transcripts WHERE session = ?", (session,))
        .fetchone()
    )
    if row is None or row["owner"] != _owner_text(owner):
        return None
    data: bytes | None = b""
    if with_data:
        data = _unpacked(bytes(row["data"]), int(row["size"]))
    if data is None or (with_data and len(data) != int(row["size"])):
        return None  # damaged: as if nothing were kept (the CLI starts anew)
    return KeptTranscript(
        session=session,
        owner=dict(owner),
        brain_session_id=str(row["brain_session_id"]),
        size=int(row["size"]),
        saved=parse_iso(str(row["saved"])),
        data=data,
    )


def _unpacked(packed: bytes, most: int) -> bytes | None:
    """``packed`` decompressed, never more than ``most`` bytes (None: damaged or over)."""
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(packed, most + 1)
    except zlib.error:
        return None
    if len(data) > most or not inflate.eof:
        return None
    return data


def drop_transcript(state: StateStore, session: str) -> bool:
    """Forget the session's conversation; True when one was kept."""
    with _migrated(state).transaction() as conn:
        cursor = conn.execute("DELETE FROM transcripts WHERE session = ?", (session,))
    return bool(cursor.rowcount)
