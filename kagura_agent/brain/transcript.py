"""The CLI's session transcript in the container, and how it crosses the brain channel.

The Claude Code CLI resumes ``--resume ID`` from the one file it wrote for the session,
``$HOME/.claude/projects/<key>/<ID>.jsonl``, ``key`` being the working directory as the
CLI names it (:func:`project_key`). The host keeps that file
between runs (patterns/transcripts.py) and the entrypoint moves it across the channel:

    host -> container  {"type": "transcript-put", "lease": ID, "cwd": DIR, "data": B64,
                        "last": bool}        chunks; after the last the file is written,
                                             before the turn (no tool has run yet)
                       {"type": "transcript-get", "lease": ID, "cwd": DIR,
                        "max_bytes": n, "chunk_bytes": c}   after the turn
    container -> host  {"type": "transcript-written", "lease": ID, "bytes": n}
                       {"type": "transcript-chunk", "lease": ID, "data": B64} ...
                       {"type": "transcript-sent", "lease": ID, "bytes": n}
                       (either answer with "error" instead when it could not)

By the time the host asks for the file the agent has run: it may have replaced it with a
link, a FIFO, a device or something huge. It is read only as a regular file opened
without following a link or blocking, and never past ``max_bytes``. Stdlib only.
"""

from __future__ import annotations

import base64
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

SESSION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# The most the entrypoint takes from the host for one transcript (the host keeps less).
MAX_PUT_BYTES = 64 * 1024 * 1024
# A chunk the host sends: base64 of this much is well under the entrypoint's line cap.
PUT_CHUNK_BYTES = 1024 * 1024
# Room on a chunk line for everything but the data.
LINE_OVERHEAD = 256
MAX_KEY_CHARS = 200
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


class TranscriptError(Exception):
    """A transcript that cannot be written or read (the message says why)."""


def chunk_bytes_for(max_line_bytes: int) -> int:
    """The raw bytes a chunk may carry so its line stays within ``max_line_bytes``."""
    return max((max_line_bytes - LINE_OVERHEAD) * 3 // 4, 256)


def encoded_chunks(data: bytes, size: int) -> Iterator[str]:
    """``data`` as base64 chunks of at most ``size`` raw bytes (one empty chunk for none)."""
    for start in range(0, max(len(data), 1), size):
        yield base64.b64encode(data[start : start + size]).decode("ascii")


def decoded(chunk: object) -> bytes:
    """One chunk's data; TranscriptError when it is not base64 text."""
    if not isinstance(chunk, str):
        raise TranscriptError("a chunk's data is not text")
    try:
        return base64.b64decode(chunk.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise TranscriptError(f"a chunk's data is not base64: {exc}") from None


def transcript_path(home: Path, cwd: object, session_id: object) -> Path:
    """Where the CLI keeps session ``session_id`` when it runs in ``cwd``."""
    if not isinstance(session_id, str) or not SESSION_ID.match(session_id):
        raise TranscriptError("the session id is not a UUID")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise TranscriptError("the working directory is not an absolute path")
    return home / ".claude" / "projects" / project_key(cwd) / f"{session_id}.jsonl"


def project_key(cwd: str) -> str:
    """The folder the CLI names after its working directory ``cwd``: its real path with
    every character but an ASCII letter or digit made a hyphen (as
    ``claude_agent_sdk.project_key_for_directory`` says; a test holds the two together).
    Not the SDK's own function: importing the SDK takes seconds of CPU, and this runs
    before the turn. A name over ``MAX_KEY_CHARS`` gets a hash from the CLI: refused."""
    key = _NOT_ALNUM.sub("-", os.path.realpath(cwd))
    if len(key) > MAX_KEY_CHARS:
        raise TranscriptError(f"the working directory is longer than {MAX_KEY_CHARS} characters")
    return key


def write_transcript(home: Path, path: Path, data: bytes) -> None:
    """Write the transcript the host kept, as the CLI would have (0600, folders 0700).

    Called before the turn, when no tool of the agent's has run in this container; an
    existing file is an error, never overwritten."""
    try:
        path.parent.relative_to(home)
    except ValueError:
        raise TranscriptError("the transcript's folder is outside HOME") from None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except OSError as exc:
        raise TranscriptError(f"cannot write the transcript: {exc.strerror or exc}") from None


def read_transcript(path: Path, max_bytes: int) -> bytes:
    """The transcript at ``path`` when it is a regular file of at most ``max_bytes``."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise TranscriptError("the CLI left no transcript of the session") from None
    except OSError as exc:
        raise TranscriptError(f"cannot open the transcript: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TranscriptError("the transcript is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as src:
            data = src.read(max_bytes + 1)
    except OSError as exc:
        raise TranscriptError(f"cannot read the transcript: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TranscriptError(f"the transcript is larger than the {max_bytes} bytes kept")
    return data
