"""Golden plan cases: tests/plans/<case>/ holds manifests, a task, facts and the expected plan.

Each case runs ``kagura-agent plan task.yml --manifests manifests --facts facts.json``
in-process with the case folder as the working directory, once with ``--json`` and once
for the human rendering (NO_COLOR), and compares both with ``expected.json`` and
``expected.txt``. ``UPDATE_GOLDEN=1 pytest tests/test_golden_plans.py`` rewrites them;
review the diff by eye, the expected files are documentation.

Normalisation, so the files do not depend on where the checkout lives or on unrelated
schema edits:

- the case folder's absolute path becomes ``$CASE``;
- ``inputs.schema_version`` becomes ``$SCHEMA_VERSION`` and ``inputs.tool_version``
  becomes ``$TOOL_VERSION``, after checking they equal the running values;
- the digest of each packaged default file (``<packaged>/…``, the layer under every
  case's own manifests) becomes ``$PACKAGED``, so editing a packaged file does not
  rewrite every case;
- ``fingerprint`` becomes ``$FINGERPRINT``. The fingerprint covers the absolute project
  root and the schema digest, so a literal value would change with the checkout path and
  every schema edit. Instead the test checks its format and that it is exactly the
  sha256 of the rest of the plan (``planner.fingerprint``); determinism itself is proven
  in test_planner_props.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from kagura_agent import __version__
from kagura_agent.cli.main import main
from kagura_agent.manifest.schema import schema_version
from kagura_agent.plan.intent import intent_fingerprint
from kagura_agent.plan.planner import fingerprint

CASES_DIR = Path(__file__).parent / "plans"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if (p / "task.yml").is_file())
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")


def run_plan(
    case_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    code = main(["plan", "task.yml", "--manifests", "manifests", "--facts", "facts.json", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def normalise_plan(plan: dict[str, Any], case_dir: Path) -> dict[str, Any]:
    assert FINGERPRINT.match(plan["fingerprint"]), plan["fingerprint"]
    assert plan["fingerprint"] == fingerprint(plan)
    assert plan["intent"] == intent_fingerprint(plan)
    assert plan["inputs"]["schema_version"] == schema_version()
    assert plan["inputs"]["tool_version"] == __version__
    plan = json.loads(json.dumps(plan).replace(str(case_dir), "$CASE"))
    plan["fingerprint"] = "$FINGERPRINT"
    plan["intent"] = "$INTENT"
    files = plan["inputs"]["files"]
    for name in files:
        if name.startswith("<packaged>/"):
            files[name] = "$PACKAGED"
    plan["inputs"]["schema_version"] = "$SCHEMA_VERSION"
    plan["inputs"]["tool_version"] = "$TOOL_VERSION"
    return plan


def normalise_text(text: str, case_dir: Path, real: dict[str, Any]) -> str:
    return (
        text.replace(str(case_dir), "$CASE")
        .replace(real["fingerprint"], "$FINGERPRINT")
        .replace(real["intent"], "$INTENT")
    )


@pytest.fixture()
def in_case(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> Path:
    case_dir = (CASES_DIR / request.param).resolve()
    monkeypatch.chdir(case_dir)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    return case_dir


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 10


@pytest.mark.parametrize("in_case", CASES, indirect=True)
def test_golden_plan(in_case: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_plan(in_case, capsys, "--json")
    raw = json.loads(out)["plans"][0]["plan"]
    expected_code = 0 if raw["applyable"] else 6  # plan refuses what apply would refuse
    assert code == expected_code, err
    plan = normalise_plan(raw, in_case)

    code, text, err = run_plan(in_case, capsys)
    assert code == expected_code, err
    text = normalise_text(text, in_case, raw)

    json_file, text_file = in_case / "expected.json", in_case / "expected.txt"
    if UPDATE:
        json_file.write_text(json.dumps(plan, indent=2, ensure_ascii=False) + "\n")
        text_file.write_text(text)
    assert plan == json.loads(json_file.read_text(encoding="utf-8"))
    assert text == text_file.read_text(encoding="utf-8")
    # No colour codes leak into a NO_COLOR rendering.
    assert "\x1b[" not in text
