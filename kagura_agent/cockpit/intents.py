"""What an inbound event asks for, recognised by its structure alone.

The first word of a message is the verb; nothing is guessed. A message that fits no verb
gets the help text back: no language model reads chat text inside the trusted cockpit
(chat is untrusted input, and the cockpit holds the keys to Docker).

    plan TASK.yml              compile and show the plan; nothing runs
    launch TASK.yml            plan, ask for any approval it needs, then apply it
    run TEXT                   the same for a one-off task, as `kagura-agent run "TEXT"`
    continue SESSION TEXT      a follow-up in that one-off task's brain session (as `repl`)
    say SESSION TEXT           steering: TEXT reaches that running session's brain as its
                               next user message (a reply in its thread does the same)
    status                     the sessions of this cockpit
    kill SESSION               stop a session: a running one is interrupted (it cleans
                               up, exit 130; the ❌ Stop button does the same), a queued
                               one is dropped, a pending request is denied
    approve REQUEST | deny REQUEST
                               answer an approval request (chat buttons do the same)
    help
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kagura_agent.cockpit.transport import Event

Kind = Literal[
    "help",
    "plan",
    "launch",
    "run",
    "continue",
    "say",
    "status",
    "kill",
    "approve",
    "deny",
    "unknown",
]

_VERBS: dict[str, Kind] = {
    "help": "help",
    "plan": "plan",
    "launch": "launch",
    "apply": "launch",
    "run": "run",
    "continue": "continue",
    "say": "say",
    "status": "status",
    "kill": "kill",
    "stop": "kill",
    "approve": "approve",
    "deny": "deny",
}
# Verbs that name their object: without one they are a usage mistake, not a command.
_NEEDS_ARGUMENT = {"plan", "launch", "run", "continue", "say", "kill", "approve", "deny"}

HELP = """\
commands:
  plan TASK.yml       compile and show the plan (nothing runs)
  launch TASK.yml     plan, ask for approvals it needs, then apply it
  run TEXT            the same for a one-off task from TEXT (an LLM brain)
  continue SESSION TEXT
                      a follow-up in that run's brain session
  say SESSION TEXT    TEXT to that running session's brain, as its next user
                      message (a reply in the session's thread does the same)
  status              sessions of this cockpit
  kill SESSION        stop a session (its ❌ Stop button does the same)
  approve REQUEST     approve a pending request (or press its button): a
                      session's (s-…), a graduation proposal's (g-…) or a
                      running session's mid-run question (m-…)
  deny REQUEST        deny it
  help                this text"""


@dataclass(frozen=True)
class Intent:
    kind: Kind
    argument: str = ""
    problem: str = ""  # set when the verb is known but used wrongly


def classify(event: Event) -> Intent:
    """The intent of ``event``: a button press, or the first word of a message."""
    if event.action:
        if event.action == "approve" and event.request:
            return Intent("approve", event.request)
        if event.action == "deny" and event.request:
            return Intent("deny", event.request)
        if event.action == "kill" and event.request:
            return Intent("kill", event.request)
        return Intent("unknown", problem=f"unknown button {event.action!r}")
    words = event.text.split()
    if not words:
        return Intent("help")
    kind = _VERBS.get(words[0].lower())
    if kind is None:
        shown = words[0] if len(words[0]) <= 40 else words[0][:40] + "…"
        return Intent("unknown", problem=f"unknown command {shown!r}")
    argument = " ".join(words[1:])
    if kind in _NEEDS_ARGUMENT and not argument:
        return Intent(kind, problem=f"{words[0].lower()} needs an argument")
    if kind in ("continue", "say") and len(words) < 3:
        return Intent(kind, problem=f"{kind} needs a session and the text to send it")
    if kind not in _NEEDS_ARGUMENT and argument:
        return Intent(kind, problem=f"{words[0].lower()} takes no argument")
    return Intent(kind, argument)
