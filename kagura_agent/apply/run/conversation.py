"""A named session's brain conversation across applies (plan ``brain.conversation``).

The sdk brain's CLI keeps its conversation in HOME, a tmpfs that ends with the container.
So, for a task naming a session:

- before the turn, :meth:`Conversation.hand_back` writes the transcript the host kept into
  the new container's HOME (through the brain channel; the entrypoint writes it, before
  any tool of the agent's has run) and the turn resumes that conversation. Nothing kept
  (never kept, too large, another owner's, damaged) or not taken: the turn starts a new
  conversation, and the run says so.
- after the turn, :meth:`Conversation.take_back` asks the entrypoint for the CLI's
  transcript of the conversation, at most ``max_bytes``. It is the agent's writing: the
  host reads it as UTF-8 text, holds it to the CLI's shape (one JSON object per line, all
  of this session: patterns/transcripts.check_transcript), scrubs every value the run's
  redactor knows (leased credentials, resolved secrets, the canary: the same redactor as
  the run's output, in any case) and keeps it compressed in the state store, replacing
  the session's last. Never run, never imported, nothing taken from it (budgets, spending
  and leases are the checkpoint's, the CLI's permission mode its flags); nothing else of
  HOME crosses (settings, hooks, plugins, memory files, other sessions' transcripts stay
  in the container and end with it). What cannot be kept (too large, not UTF-8, not the
  CLI's shape or another session's entries in it, missing, the container not answering)
  drops the session's last transcript too: the next run starts a new conversation rather
  than one that misses this run's part.

A run the host stops (a kill, a wall or turn budget overrun, a tripwire) has no turn end:
the session keeps what its last finished run left. A turn that ends on a budget nobody
extended is a turn end: its conversation is kept (the engine's checkpoint names it), and
the next run resumes it within what the session has left (plan/resume.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kagura_agent.apply.records.progress import SessionConversation
from kagura_agent.apply.run.context import RunContext
from kagura_agent.brain.channel import BrainChannel, TranscriptRefused
from kagura_agent.patterns.checkpoint import session_owner
from kagura_agent.patterns.transcripts import (
    KeptTranscript,
    TranscriptLimits,
    TranscriptRejected,
    TranscriptTooLarge,
    check_transcript,
    drop_transcript,
    keep_transcript,
    load_transcript,
)
from kagura_agent.plan.conversation import MAX_BYTES
from kagura_agent.plan.model import Plan
from kagura_agent.units import format_size


@dataclass(frozen=True)
class Conversation:
    """The conversation of one run's named session, as the plan says it is kept."""

    session: str
    owner: dict[str, str]
    cwd: str
    limits: TranscriptLimits

    @classmethod
    def of(cls, plan: Plan) -> Conversation | None:
        """The plan's conversation, or None when it keeps none (no session, another
        engine, ``runtime: host`` where the CLI's own HOME keeps it)."""
        section = plan["brain"].get("conversation")
        if section is None:
            return None
        task = plan["task"]
        return cls(
            session=section["session"],
            owner=session_owner(task["project_root"], task["kind"]),
            cwd=plan["hardening"]["workdir"],
            # A plan file cannot raise what the host keeps.
            limits=TranscriptLimits(max_bytes=min(section["max_bytes"], MAX_BYTES)),
        )

    async def hand_back(
        self, ctx: RunContext, channel: BrainChannel, brain_session_id: str
    ) -> str | None:
        """Give the container the kept transcript of ``brain_session_id``; the id the turn
        resumes, or None (a new conversation, said why)."""
        kept = load_transcript(ctx.store, self.session, self.owner)
        if kept is None or kept.brain_session_id != brain_session_id:
            ctx.live.emit(SessionConversation(self.session, "missing"))
            return None
        try:
            await channel.send_transcript(brain_session_id, self.cwd, kept.data)
        except TranscriptRefused as exc:
            ctx.live.emit(SessionConversation(self.session, "refused", why=str(exc)))
            return None
        ctx.live.emit(SessionConversation(self.session, "restored", size=format_size(kept.size)))
        return brain_session_id

    async def take_back(
        self, ctx: RunContext, channel: BrainChannel, brain_session_id: str | None
    ) -> None:
        """Keep the CLI's transcript of ``brain_session_id`` after the turn, scrubbed."""
        if brain_session_id is None:
            return
        why = ""
        try:
            data = await channel.fetch_transcript(brain_session_id, self.cwd, self.limits.max_bytes)
            text = data.decode("utf-8")
            check_transcript(text, brain_session_id)
        except (TranscriptRefused, TranscriptRejected) as exc:
            why = str(exc)
        except UnicodeDecodeError:
            why = "the transcript is not UTF-8 text"
        if not why:
            scrubbed = ctx.live.redactor.scrub_any_case(text).encode("utf-8")
            kept = KeptTranscript(
                session=self.session,
                owner=self.owner,
                brain_session_id=brain_session_id,
                size=len(scrubbed),
                saved=ctx.clock.now(),
                data=scrubbed,
            )
            try:
                evicted = keep_transcript(ctx.store, kept, limits=self.limits, clock=ctx.clock)
            except TranscriptTooLarge as exc:  # scrubbing made it longer
                why = str(exc)
            else:
                self._kept(ctx, kept, evicted)
                return
        drop_transcript(ctx.store, self.session)
        ctx.live.emit(SessionConversation(self.session, "not_kept", why=why))

    def _kept(self, ctx: RunContext, kept: KeptTranscript, evicted: list[str]) -> None:
        ctx.live.emit(SessionConversation(self.session, "kept", size=format_size(kept.size)))
        for session in evicted:
            most = f"{self.limits.per_owner} per project and task kind, {self.limits.total} in all"
            ctx.live.emit(SessionConversation(session, "dropped", why=most))
