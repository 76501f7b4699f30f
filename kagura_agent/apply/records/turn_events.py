"""The events of the brain's turn and after (records/event.py): resume, steering, the
agent's branch, the kept conversation, mid-run sub-agents, requests and budgets, the
record of the run. Each reads as the line the run has always shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kagura_agent.apply.records.event import ProgressEvent, Severity, register

# The brain's turn: resume, steering, the agent's branch, the kept conversation.


@register
@dataclass(frozen=True)
class SessionResumed(ProgressEvent):
    event = "session_resumed"
    kind = "phase"
    level = Severity.QUIET
    text: str  # patterns/checkpoint.py Checkpoint.message

    @property
    def message(self) -> str:
        return self.text


@register
@dataclass(frozen=True)
class BrainRunning(ProgressEvent):
    event = "brain_running"
    kind = "phase"
    level = Severity.QUIET
    brain: str
    engine: str

    @property
    def message(self) -> str:
        return f"brain {self.brain} ({self.engine}) running"


@register
@dataclass(frozen=True)
class SteeringIgnored(ProgressEvent):
    event = "steering_ignored"

    @property
    def message(self) -> str:
        return 'steering: ignored a line that is not {"text": "..."}'


@register
@dataclass(frozen=True)
class MessageDelivered(ProgressEvent):
    """An operator's message to the running brain: taken as its next user message, or
    not (``why``)."""

    event = "message_delivered"
    number: int
    reached: bool
    why: str = ""

    @property
    def message(self) -> str:
        if self.reached:
            return f"↳ message {self.number} reached the brain as its next user message"
        return f"↳ message {self.number} did not reach the brain: {self.why}"


@register
@dataclass(frozen=True)
class AgentRepository(ProgressEvent):
    """The agent's repository made in the container."""

    event = "agent_repository"
    kind = "phase"
    level = Severity.QUIET
    branch: str
    seed: str

    @property
    def message(self) -> str:
        return f"the agent's repository: branch {self.branch} at {self.seed[:12]}"


@register
@dataclass(frozen=True)
class BranchTaking(ProgressEvent):
    """The agent's branch being taken out of its container (``checking``: its commits
    being checked on the host)."""

    event = "branch_taking"
    kind = "phase"
    level = Severity.QUIET
    branch: str
    checking: bool = False

    @property
    def message(self) -> str:
        if self.checking:
            return f"checking the agent's commits for branch {self.branch}"
        return f"taking the agent's branch {self.branch} out of its container"


@register
@dataclass(frozen=True)
class BranchTaken(ProgressEvent):
    """What became of the agent's branch (apply/run/agentbranch.py Imported.summary)."""

    event = "branch_taken"
    summary: str
    imported: bool

    @property
    def severity(self) -> Severity:
        return Severity.GOOD if self.imported else Severity.WARNING

    @property
    def message(self) -> str:
        return self.summary


@register
@dataclass(frozen=True)
class SessionConversation(ProgressEvent):
    """What became of a session's kept brain conversation (apply/run/conversation.py):
    ``what`` is one of CONVERSATION's keys; ``why`` and ``size`` fill its words."""

    event = "conversation"
    session: str
    what: Literal["missing", "refused", "restored", "not_kept", "kept", "dropped"]
    why: str = ""
    size: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self.what in ("refused", "not_kept") else Severity.INFO

    @property
    def message(self) -> str:
        said = CONVERSATION.get(self.what, "{what}")
        return f"session {self.session!r}: " + said.format(
            what=self.what, why=self.why, size=self.size
        )


CONVERSATION = {
    "missing": "its last conversation was not kept; the brain starts a new one",
    "refused": "the container did not take its conversation ({why}); the brain starts a new one",
    "restored": "its conversation ({size}) is back in the container's HOME;"
    " nothing else of the last run's HOME is",
    "not_kept": "its conversation was not kept ({why}); its next run starts a new one",
    "kept": "its conversation is kept for the next run ({size}, scrubbed of this run's secrets)",
    "dropped": "its conversation was dropped to keep at most {why}",
}


# Mid-run: sub-agents, requests, budgets.


@register
@dataclass(frozen=True)
class SubAgent(ProgressEvent):
    """A sub-agent's course (apply/midrun/dispatch.py): ``what`` is one of SUB_AGENT's
    keys; ``detail`` fills its words."""

    event = "sub_agent"
    task: str
    what: Literal["refused", "waits", "ended", "killed"]
    detail: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.PROBLEM if self.what in ("refused", "killed") else Severity.INFO

    @property
    def message(self) -> str:
        said = SUB_AGENT.get(self.what, "{what}")
        return f"sub-agent {self.task}" + said.format(what=self.what, detail=self.detail)


SUB_AGENT = {
    "refused": " refused: {detail}",
    "waits": " waits: {detail} already running",
    "ended": " {detail}",
    "killed": " overran its stop: killed",
}


@register
@dataclass(frozen=True)
class SubAgentStep(ProgressEvent):
    """A sub-agent reached a step: ``starting`` (its plan), or ``approval`` (its plan
    needs the categories in ``detail``)."""

    event = "sub_agent_step"
    kind = "phase"
    level = Severity.QUIET
    task: str
    what: Literal["starting", "approval"]
    detail: str = ""
    plan: str = ""

    @property
    def message(self) -> str:
        if self.what == "starting":
            return f"sub-agent {self.task}: starting (plan {self.plan[:19]}…)"
        return f"sub-agent {self.task} needs approval for {self.detail} (plan {self.plan[:19]}…)"


@register
@dataclass(frozen=True)
class SubAgentPhase(ProgressEvent):
    """A running sub-agent's phase, relayed from its own view."""

    event = "sub_agent_phase"
    task: str
    text: str

    @property
    def message(self) -> str:
        return f"  [{self.task}] {self.text}"


@register
@dataclass(frozen=True)
class SubAgentsStopping(ProgressEvent):
    event = "sub_agents_stopping"
    kind = "phase"
    level = Severity.QUIET
    count: int
    stopped: bool = False

    @property
    def message(self) -> str:
        if self.stopped:
            return f"{self.count} sub-agent(s) stopped"
        return f"stopping {self.count} sub-agent(s)"


@register
@dataclass(frozen=True)
class RequestsCapped(ProgressEvent):
    event = "requests_capped"
    level = Severity.WARNING
    limit: int

    @property
    def message(self) -> str:
        return (
            f"mid-run requests: this run made {self.limit}, the most it may; the rest are"
            " refused without being shown or recorded"
        )


@register
@dataclass(frozen=True)
class MidRunRequest(ProgressEvent):
    """The brain asked for a capability mid-run (``name`` and ``reason`` are its words,
    neutralised and scrubbed)."""

    event = "midrun_request"
    request: str
    what: str  # egress, credential
    name: str
    reason: str

    @property
    def message(self) -> str:
        return f"mid-run request {self.request}: {self.what} {self.name!r} ({self.reason})"


@register
@dataclass(frozen=True)
class BudgetRequest(ProgressEvent):
    """The brain ran out of a budget and asks for more."""

    event = "budget_request"
    request: str
    budget: str
    reason: str

    @property
    def message(self) -> str:
        return (
            f"budget request {self.request}: the brain ran out of its {self.budget} budget"
            f" ({self.reason})"
        )


@register
@dataclass(frozen=True)
class RequestAnswered(ProgressEvent):
    """A mid-run request or extension settled: ``outcome`` granted (``said``: what is in
    force now), denied or timeout (``said``: who said so; ``category``), refused by the
    manifests or by kagura-agent before anyone was asked, or failed (approved, but it
    could not be put in force)."""

    event = "request_answered"
    request: str
    outcome: Literal["granted", "denied", "timeout", "refused", "failed"]
    said: str
    category: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.PROBLEM if self.outcome == "failed" else Severity.INFO

    @property
    def message(self) -> str:
        if self.outcome == "refused":
            return f"↳ {self.request} refused: {self.said}"
        if self.outcome in ("denied", "timeout"):
            return f"↳ {self.request} {self.category}: {self.said}"
        return f"↳ {self.request}: {self.said}"


@register
@dataclass(frozen=True)
class BudgetNotExtended(ProgressEvent):
    """A budget the run will stop at: the manifests refused its extension (``request``
    names it) or an operator did not grant it (``said``)."""

    event = "budget_not_extended"
    budget: str  # wall, lease, or a brain budget's words (BRAIN_BUDGETS)
    said: str
    request: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self.request else Severity.INFO

    @property
    def message(self) -> str:
        if self.request:
            return f"↳ {self.request}: {self.budget} budget not extended: {self.said}"
        stops = "the run stops"
        if self.budget in ("wall", "lease"):  # the time budgets: they run out
            stops += " when it runs out"
        return f"{self.budget} budget not extended ({self.said}): {stops}"


# The record of the run: graduation, memory, the journal, the end.


@register
@dataclass(frozen=True)
class GraduationNoEvidence(ProgressEvent):
    event = "graduation_no_evidence"

    @property
    def message(self) -> str:
        return "graduation: a sub-agent's own verify commands earn no evidence"


@register
@dataclass(frozen=True)
class GraduationDemoted(ProgressEvent):
    event = "graduation_demoted"
    level = Severity.PROBLEM
    category: str
    reason: str

    @property
    def message(self) -> str:
        return (
            f"graduation: {self.category} demoted to ask-every-time, its count restarts"
            f" ({self.reason})"
        )


@register
@dataclass(frozen=True)
class FailuresLinked(ProgressEvent):
    """A successful run and the earlier failures it fixes (``fixed``, its summary) or
    leaves open (``open``: it changed nothing recorded since)."""

    event = "failures_linked"
    fixed: int
    summary: str = ""
    open: int = 0

    @property
    def message(self) -> str:
        if self.open:
            return (
                f"{self.open} earlier failure(s) stay open: this run changed nothing recorded"
                " (steps, instruction, capabilities) since"
            )
        return f"linked this run as the fix of {self.fixed} earlier failure(s): {self.summary}"


@register
@dataclass(frozen=True)
class TokensOverBudget(ProgressEvent):
    event = "tokens_over_budget"
    level = Severity.WARNING
    used: int
    limit: int

    @property
    def message(self) -> str:
        return f"the run used {self.used:,} tokens, over its learnt budget of {self.limit:,}"


@register
@dataclass(frozen=True)
class RunFinished(ProgressEvent):
    event = "run_finished"
    kind = "phase"
    level = Severity.QUIET
    run_id: str
    succeeded: bool
    wall_seconds: float
    cost_usd: float | None = None

    @property
    def message(self) -> str:
        verdict = "succeeded" if self.succeeded else "FAILED"
        cost = f", cost ${self.cost_usd:.4f}" if self.cost_usd is not None else ""
        return f"run {self.run_id} {verdict} in {self.wall_seconds:.1f}s{cost}"


@register
@dataclass(frozen=True)
class OutputMemory(ProgressEvent):
    """A dispatched child's output memory, for its parent."""

    event = "output_memory"
    memory: str

    @property
    def message(self) -> str:
        return (
            f"output memory {self.memory} (the parent recalls it:"
            f" kagura-agent memory show {self.memory})"
        )


@register
@dataclass(frozen=True)
class TimelineIncomplete(ProgressEvent):
    """The store refused a batch of the run's journal."""

    event = "timeline_incomplete"
    level = Severity.WARNING
    problem: str

    @property
    def message(self) -> str:
        return f"the run's timeline is incomplete: {self.problem}"
