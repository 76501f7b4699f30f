"""Plain values describing graduation state: what the planner reads, what the CLI shows.

``GraduationSnapshot`` is gathered from the state store before planning (a Fact) and is
fully serialisable; its ``version`` changes whenever any category changes state (graduated,
demoted, reset), so a plan that recorded it goes stale when graduation changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from kagura_agent.graduation.knobs import Knobs, format_duration, parse_duration

State = Literal["locked", "proposed", "graduated"]


@dataclass(frozen=True)
class CategoryStatus:
    """One capability category's trust standing, counted since its last reset."""

    category: str
    state: State
    successes: int = 0
    distinct_tasks: int = 0
    span: timedelta = timedelta(0)
    failures: int = 0
    reset_at: str | None = None
    graduated_at: str | None = None
    graduated_by: str | None = None
    last_reset_reason: str | None = None
    unmet: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "category": self.category,
            "state": self.state,
            "successes": self.successes,
            "distinct_tasks": self.distinct_tasks,
            "span": format_duration(self.span),
            "span_seconds": int(self.span.total_seconds()),
            "failures": self.failures,
            "reset_at": self.reset_at,
            "graduated_at": self.graduated_at,
            "graduated_by": self.graduated_by,
            "last_reset_reason": self.last_reset_reason,
            "unmet": list(self.unmet),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> CategoryStatus:
        def opt(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        state = str(data["state"])
        if state not in ("locked", "proposed", "graduated"):
            raise ValueError(f"unknown graduation state {state!r}")
        unmet = data.get("unmet", [])
        return cls(
            category=str(data["category"]),
            state=state,  # type: ignore[arg-type]  # checked just above
            successes=_int(data.get("successes", 0)),
            distinct_tasks=_int(data.get("distinct_tasks", 0)),
            span=timedelta(seconds=_int(data.get("span_seconds", 0))),
            failures=_int(data.get("failures", 0)),
            reset_at=opt("reset_at"),
            graduated_at=opt("graduated_at"),
            graduated_by=opt("graduated_by"),
            last_reset_reason=opt("last_reset_reason"),
            unmet=tuple(str(item) for item in unmet) if isinstance(unmet, list) else (),
        )


def unmet_knobs(
    knobs: Knobs, *, successes: int, distinct_tasks: int, span: timedelta, failures: int
) -> tuple[str, ...]:
    """The knobs that do not hold yet, each as "name have/need" (empty: propose)."""
    unmet: list[str] = []
    if successes < knobs.min_successes:
        unmet.append(f"min_successes {successes}/{knobs.min_successes}")
    if distinct_tasks < knobs.min_distinct_tasks:
        unmet.append(f"min_distinct_tasks {distinct_tasks}/{knobs.min_distinct_tasks}")
    if span < knobs.cooldown:
        unmet.append(f"cooldown {format_duration(span)}/{format_duration(knobs.cooldown)}")
    if failures:
        unmet.append(f"failures since reset {failures}/0")
    return tuple(unmet)


@dataclass(frozen=True)
class GraduationSnapshot:
    """Every known category's status plus the knobs used; unknown categories are locked."""

    version: int
    knobs: Knobs = field(default_factory=Knobs)
    categories: Mapping[str, CategoryStatus] = field(default_factory=dict)

    def status(self, category: str) -> CategoryStatus:
        """The category's status; a category never seen is locked with no evidence."""
        known = self.categories.get(category)
        if known is not None:
            return known
        unmet = unmet_knobs(
            self.knobs, successes=0, distinct_tasks=0, span=timedelta(0), failures=0
        )
        return CategoryStatus(category=category, state="locked", unmet=unmet)

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "knobs": self.knobs.to_json(),
            "categories": {name: s.to_json() for name, s in sorted(self.categories.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> GraduationSnapshot:
        raw_knobs = data.get("knobs", {})
        knobs = Knobs()
        if isinstance(raw_knobs, Mapping):
            cooldown = raw_knobs.get("cooldown", "7d")
            knobs = Knobs(
                min_successes=_int(raw_knobs.get("min_successes", knobs.min_successes)),
                min_distinct_tasks=_int(
                    raw_knobs.get("min_distinct_tasks", knobs.min_distinct_tasks)
                ),
                cooldown=parse_duration(cooldown if isinstance(cooldown, str | int) else "7d"),
            )
        raw = data.get("categories", {})
        categories: dict[str, CategoryStatus] = {}
        if isinstance(raw, Mapping):
            for name, value in raw.items():
                if isinstance(value, Mapping):
                    categories[str(name)] = CategoryStatus.from_json(value)
        return cls(version=_int(data.get("version", 0)), knobs=knobs, categories=categories)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)
