"""Graduation knobs: durations and the Graduation manifest's spec."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kagura_agent.errors import UsageError
from kagura_agent.graduation import (
    GraduationSnapshot,
    Knobs,
    format_duration,
    knobs_from_spec,
    parse_duration,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * 86400),
        ("12h", 12 * 3600),
        ("30m", 1800),
        ("45s", 45),
        ("1w", 7 * 86400),
        ("1d12h", 36 * 3600),
        (90, 90),
    ],
)
def test_parse_duration(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "7", "7x", "d7", "1h1d", "-3d", True])
def test_parse_duration_rejects(text: str | int) -> None:
    with pytest.raises(UsageError, match="invalid duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(timedelta(days=7)) == "7d"
    assert format_duration(timedelta(days=1, hours=12, minutes=5)) == "1d12h"
    assert format_duration(timedelta(0)) == "0s"


def test_defaults() -> None:
    knobs = knobs_from_spec({})
    assert knobs == Knobs(min_successes=5, min_distinct_tasks=3, cooldown=timedelta(days=7))
    assert knobs.to_json()["failure_window"] == "since-reset"


def test_spec_overrides() -> None:
    spec = {
        "min_successes": 10,
        "min_distinct_tasks": 4,
        "cooldown": "12h",
        "baseline": ["egress:pypi"],  # the planner's keys in the same manifest
        "reserve": 0.3,
    }
    assert knobs_from_spec(spec) == Knobs(10, 4, timedelta(hours=12))


def test_spec_reports_every_problem_at_once() -> None:
    spec = {
        "min_sucesses": 3,
        "min_distinct_tasks": 0,
        "cooldown": "soon",
        "failure_window": "30d",
    }
    with pytest.raises(UsageError) as caught:
        knobs_from_spec(spec)
    message = caught.value.message
    for fragment in ("'min_sucesses'", "min_distinct_tasks", "cooldown", "failure_window"):
        assert fragment in message


@pytest.mark.parametrize("cooldown", ["7d", "100000s", "90m", "1d12h5m"])
def test_knobs_survive_a_snapshot_round_trip_exactly(cooldown: str) -> None:
    # The display form keeps two units ("1d3h"); the stored form must keep every second.
    knobs = knobs_from_spec({"cooldown": cooldown})
    restored = GraduationSnapshot.from_json({"knobs": knobs.to_json()}).knobs
    assert restored == knobs
    assert restored.cooldown == parse_duration(cooldown)
