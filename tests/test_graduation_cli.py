"""``kagura-agent graduation`` through the real entry point, with an isolated state dir."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kagura_agent import approvals
from kagura_agent.cli import main as cli_main
from kagura_agent.clock import FixedClock
from kagura_agent.graduation import record_outcome
from kagura_agent.state import open_store

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")

DNS = "credential:cloudflare/dns-write"
APT = "egress:debian-packages"
PLAN = "sha256:" + "c" * 64
REAL_COMMAND_MODULES = cli_main.COMMAND_MODULES


@pytest.fixture(autouse=True)
def only_graduation(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other commands are built by other engineers in parallel; isolate this module's CLI
    # from their import state. Registration itself is checked separately below.
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("graduation",))


GRADUATION = """\
apiVersion: kagura.dev/v1
kind: Graduation
metadata:
  name: default
spec:
  min_successes: {successes}
  min_distinct_tasks: 3
  cooldown: 7d
"""


@pytest.fixture()
def manifests(tmp_path: Path) -> Path:
    """A manifest set holding the design-default Graduation knobs."""
    return _manifests(tmp_path / "manifests", successes=5)


def _manifests(directory: Path, *, successes: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graduation.yml").write_text(GRADUATION.format(successes=successes))
    return directory


def _seed(state_dir: Path) -> None:
    """DNS earns a proposal (5 successes, 3 tasks, 8 days); APT has two successes."""
    clock = FixedClock(datetime(2025, 3, 1, tzinfo=UTC))
    store = open_store()
    for index, task in enumerate(["dns-a", "dns-b", "dns-c", "dns-a", "dns-b"]):
        record_outcome(store, [DNS], f"run-{index}", task, PLAN, [("dig", 0)], clock)
        clock.advance(timedelta(days=2))
    for index in range(2):
        record_outcome(store, [APT], f"apt-{index}", "install", PLAN, [("apt", 0)], clock)
    approvals.record_decision(
        store,
        approvals.Verdict(
            category=APT, fingerprint=PLAN, outcome="timeout", who="alice", via="cli"
        ),
        clock=clock,
    )
    store.close()


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert cli_main.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_registered_in_the_real_module_list() -> None:
    assert "graduation" in REAL_COMMAND_MODULES


def test_status_proposals_approve_reset_history(
    state_dir: Path, manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(state_dir)
    flag = f"--manifests={manifests}"
    status = _json(capsys, ["graduation", "status", "--json", flag])
    assert isinstance(status, dict)
    categories = status["categories"]
    assert categories[DNS]["state"] == "proposed"
    assert categories[APT]["state"] == "locked"
    assert categories[APT]["unmet"] == [
        "min_successes 2/5",
        "min_distinct_tasks 1/3",
        "cooldown 0s/7d",
    ]

    assert cli_main.main(["graduation", "status", flag]) == 0
    text = capsys.readouterr().out
    assert "graduation approve " + DNS in text and "min_successes 2/5" in text

    found = _json(capsys, ["graduation", "proposals", "--json", flag])
    assert [item["category"] for item in found["proposals"]] == [DNS]

    assert cli_main.main(["graduation", "approve", APT, "--who", "alice", flag]) == 6
    assert "no graduation proposal" in capsys.readouterr().err

    assert cli_main.main(["graduation", "approve", DNS, "--who", "alice", flag]) == 0
    capsys.readouterr()
    status = _json(capsys, ["graduation", "status", "--json", flag])
    assert status["categories"][DNS]["state"] == "graduated"
    assert status["categories"][DNS]["graduated_by"] == "alice"

    assert cli_main.main(["graduation", "proposals", flag]) == 0
    assert "no graduation proposals" in capsys.readouterr().out

    assert cli_main.main(["graduation", "reset", DNS, "--who", "bob"]) == 0
    capsys.readouterr()
    status = _json(capsys, ["graduation", "status", "--json", flag])
    assert status["categories"][DNS]["state"] == "locked"
    assert status["categories"][DNS]["successes"] == 0

    log = _json(capsys, ["graduation", "history", "--json"])
    assert isinstance(log, dict)
    outcomes = [(d["category"], d["kind"], d["outcome"]) for d in log["decisions"]]
    assert outcomes == [(DNS, "graduation", "approved"), (APT, "capability", "timeout")]
    assert [e["event"] for e in log["graduation_events"]] == ["reset", "graduated"]

    assert cli_main.main(["graduation", "history"]) == 0
    text = capsys.readouterr().out
    assert "timeout" in text and "reset by bob" in text


def test_empty_state(state_dir: Path, manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["graduation", "status", f"--manifests={manifests}"]) == 0
    assert "no capability category has evidence yet" in capsys.readouterr().out
    assert cli_main.main(["graduation", "history"]) == 0
    assert "no approval decisions" in capsys.readouterr().out
    assert cli_main.main(["graduation"]) == 2


def test_manifest_knobs_bind_the_cli(
    state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A manifest that raises the bar cannot be bypassed by approving from the CLI.
    _seed(state_dir)
    strict = f"--manifests={_manifests(tmp_path / 'strict', successes=10)}"
    status = _json(capsys, ["graduation", "status", "--json", strict])
    assert status["knobs"]["min_successes"] == 10
    assert status["categories"][DNS]["unmet"] == ["min_successes 5/10"]
    assert cli_main.main(["graduation", "approve", DNS, "--who", "alice", strict]) == 6
    assert "min_successes 5/10" in capsys.readouterr().err


def test_invalid_manifests_refuse(
    state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _manifests(tmp_path / "broken", successes=0)
    assert cli_main.main(["graduation", "status", f"--manifests={broken}"]) == 2
    assert "min_successes" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["reset", "approve"])
@pytest.mark.parametrize("category", ["dns-write", "cred:x", "image:", ""])
def test_a_category_that_is_not_one_is_refused_and_nothing_stored(
    state_dir: Path, action: str, category: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["graduation", action, category])
    assert exit_info.value.code == 2
    assert "is not a capability category" in capsys.readouterr().err
    assert cli_main.main(["graduation", "history", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "errors": [],
        "decisions": [],
        "graduation_events": [],
    }


def test_history_with_only_state_changes_prints_no_empty_table(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main.main(["graduation", "reset", "image:agent", "--who", "alice"]) == 0
    capsys.readouterr()
    assert cli_main.main(["graduation", "history"]) == 0
    out = capsys.readouterr().out
    assert "WHEN" not in out
    assert "image:agent  reset by alice" in out


def test_a_parser_built_for_this_modules_list_is_not_another_lists(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() caches its parser per process: the one built for this module's single
    command must not answer a later main() with the real list (a later test in the same
    worker got "invalid choice: 'plan' (choose from 'graduation')")."""
    with pytest.raises(SystemExit):
        cli_main.main(["graduation", "--help"])
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", REAL_COMMAND_MODULES)
    with pytest.raises(SystemExit) as done:
        cli_main.main(["plan", "--help"])
    assert done.value.code == 0, capsys.readouterr().err
