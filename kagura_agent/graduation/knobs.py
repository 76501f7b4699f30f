"""Graduation knobs: when a category has earned a *proposal* to unlock it.

The knobs gate proposals, not grants — a human always makes the unlock. Defaults follow
the design: five verified successes, over at least three distinct tasks, spread over at
least seven days, with no failure since the category was last reset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from kagura_agent import units
from kagura_agent.errors import UsageError

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# The only failure window the design allows; accepted so a manifest can spell it out.
FAILURE_WINDOW = "since-reset"


@dataclass(frozen=True)
class Knobs:
    """Thresholds that must all hold before a category is proposed for graduation."""

    min_successes: int = 5
    min_distinct_tasks: int = 3
    cooldown: timedelta = timedelta(days=7)

    def to_json(self) -> dict[str, object]:
        return {
            "min_successes": self.min_successes,
            "min_distinct_tasks": self.min_distinct_tasks,
            # Exact (format_duration shortens for display): this form is read back.
            "cooldown": units.format_duration(self.cooldown.total_seconds()),
            "failure_window": FAILURE_WINDOW,
        }


def parse_duration(text: str | int) -> timedelta:
    """Parse "7d", "12h", "30m", "45s", "1w", combinations like "1d12h", or whole seconds."""
    if isinstance(text, bool):
        raise UsageError(f"invalid duration {text!r}", hint='write e.g. "7d", "12h" or "30m"')
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"invalid duration {text!r}: negative")
        return timedelta(seconds=text)
    try:
        return timedelta(seconds=units.parse_duration(text.strip()))
    except ValueError:
        raise UsageError(
            f"invalid duration {text!r}", hint='write e.g. "7d", "12h" or "30m"'
        ) from None


def format_duration(delta: timedelta) -> str:
    """Render a duration in at most two units, largest first: "7d", "1d12h", "0s"."""
    seconds = max(0, int(delta.total_seconds()))
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        count, seconds = divmod(seconds, _UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts[:2]) or "0s"


def knobs_from_spec(spec: Mapping[str, object]) -> Knobs:
    """Build Knobs from a Graduation manifest's spec; missing keys keep their defaults.

    Unknown keys are errors: a misspelt knob must never be silently ignored. The spec's
    other keys (``baseline``, ``reserve``) are accepted and left to the planner.
    """
    problems: list[str] = []
    # "baseline" and "reserve" live in the same manifest but are read by the planner.
    known = {"min_successes", "min_distinct_tasks", "cooldown", "failure_window"}
    known |= {"baseline", "reserve", "tripwires", "budget_quantile", "budget_floors"}
    known |= {"failure_half_life", "min_trust", "budget_min_runs", "budget_step"}
    problems += [f"unknown graduation knob {key!r}" for key in sorted(set(spec) - known)]
    defaults = Knobs()
    counts: dict[str, int] = {}
    for key in ("min_successes", "min_distinct_tasks"):
        value = spec.get(key, getattr(defaults, key))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{key} must be a positive integer, got {value!r}")
        else:
            counts[key] = value
    cooldown = defaults.cooldown
    raw = spec.get("cooldown")
    if raw is not None:
        if isinstance(raw, str | int):
            try:
                cooldown = parse_duration(raw)
            except UsageError as exc:
                problems.append(f"cooldown: {exc.message}")
        else:
            problems.append(f"cooldown must be a duration like '7d', got {raw!r}")
    window = spec.get("failure_window", FAILURE_WINDOW)
    if window != FAILURE_WINDOW:
        problems.append(f"failure_window must be {FAILURE_WINDOW!r}, got {window!r}")
    if problems:
        raise UsageError("invalid Graduation knobs: " + "; ".join(problems))
    return Knobs(
        min_successes=counts["min_successes"],
        min_distinct_tasks=counts["min_distinct_tasks"],
        cooldown=cooldown,
    )
