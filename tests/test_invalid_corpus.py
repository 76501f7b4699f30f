"""The invalid-input corpus: tests/invalid/<case>.yml, each declaring its exact diagnostics.

Every case starts with comment lines ``# expect: LINE:COL JSON.PATH  message fragment``,
one per error the case must produce. The test runs
``kagura-agent validate --json --manifests _manifests <case>.yml`` in-process from
tests/invalid and asserts exit code 2, that every reported error is in the case file at
exactly the declared line, column and JSON path (the fragment must occur in the
message), and that nothing else is reported. ``_manifests/`` is a minimal valid set
whose names appear in the "known names" hints.

A task file may only hold Task documents, so a case defining other kinds is a case of
the operator's folder: it is checked as ``ops/<case>.yml`` in a copy of ``_manifests``
(``--manifests ops``) — unless it says ``# read-as: task``, when it is the task file
whose extra documents must be refused.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kagura_agent.cli.main import main

# One worker for the module (pytest-xdist --dist loadgroup): every test binds the one
# socket mount-socket.yml names, in the corpus folder itself.
pytestmark = pytest.mark.xdist_group("invalid-corpus")

CORPUS = Path(__file__).parent / "invalid"
CASES = sorted(p.name for p in CORPUS.glob("*.yml"))
EXPECT = re.compile(r"^# expect: (\d+):(\d+) (\S+)(?:  (.*))?$")


def expectations(case: str) -> list[tuple[int, int, str, str]]:
    found = []
    for line in (CORPUS / case).read_text(encoding="utf-8").splitlines():
        match = EXPECT.match(line)
        if match:
            found.append((int(match[1]), int(match[2]), match[3], (match[4] or "").strip()))
    return found


@pytest.fixture()
def in_corpus(monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Iterator[Path]:
    """Run from tests/invalid, with the socket that mount-socket.yml names in place."""
    monkeypatch.chdir(CORPUS)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    sock_path = CORPUS / "_fixtures" / "agent.sock"
    sock_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        yield CORPUS
    finally:
        server.close()
        sock_path.unlink(missing_ok=True)


def test_the_module_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    """Under pytest-xdist's loadgroup the module's tests carry their group, or two workers
    bind the one socket at once (tests/conftest.py names the group for pytest 9.2)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on a pytest-xdist worker under --dist loadgroup: one process")
    assert request.node.nodeid.endswith("@invalid-corpus"), request.node.nodeid


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    for case in CASES:
        assert expectations(case), f"{case} declares no '# expect:' line"


def test_minimal_manifest_set_is_valid(in_corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--manifests", "_manifests"]) == 0, capsys.readouterr().err


def is_operator_case(case: str) -> bool:
    text = (CORPUS / case).read_text(encoding="utf-8")
    if "# read-as: task" in text:
        return False
    kinds = re.findall(r"^kind:\s*(\S+)", text, flags=re.MULTILINE)
    return any(kind != "Task" for kind in kinds)


@pytest.mark.parametrize("case", CASES)
def test_invalid_case(
    case: str,
    in_corpus: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if is_operator_case(case):
        shutil.copytree(CORPUS / "_manifests", tmp_path / "ops")
        shutil.copy(CORPUS / case, tmp_path / "ops" / case)
        monkeypatch.chdir(tmp_path)
        code = main(["validate", "--json", "--manifests", "ops"])
        shown = f"ops/{case}"
    else:
        code = main(["validate", "--json", "--manifests", "_manifests", case])
        shown = case
    out, err = capsys.readouterr()
    assert code == 2, out + err
    report = json.loads(out)
    assert report["valid"] is False
    errors = report["errors"]
    assert all(e["file"] == shown for e in errors), errors
    got = sorted((e["line"], e["col"], e["path"]) for e in errors)
    want = sorted((line, col, path) for line, col, path, _ in expectations(case))
    assert got == want, "\n".join(
        f"{e['line']}:{e['col']} {e['path']}  {e['message']}" for e in errors
    )
    for line, col, path, fragment in expectations(case):
        messages = [
            e["message"] for e in errors if (e["line"], e["col"], e["path"]) == (line, col, path)
        ]
        assert any(fragment in m for m in messages), (fragment, messages)


@pytest.mark.parametrize("case", ["yaml-syntax-error.yml", "unknown-brain.yml"])
def test_human_output_is_located(
    case: str, in_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --json the same errors print as ``file:line:col  $.path  message`` lines."""
    assert main(["validate", "--manifests", "_manifests", case]) == 2
    err = capsys.readouterr().err
    line, col, path, _ = expectations(case)[0]
    assert f"{case}:{line}:{col}  {path}  " in err
    assert "Traceback" not in err
