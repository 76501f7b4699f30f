"""``validate`` and ``plan`` start fast: what they import, in a real interpreter start.

The process boundary is the point here (a fresh ``python -m kagura_agent``, nothing
imported before it), so this test starts real subprocesses. asyncio (with logging,
concurrent.futures and ssl under it, ~13% of validate's start) is for commands that run
an event loop; the memory stores (sqlite3, psycopg's module, uuid) are for plan, which
reads them, and apply; http.client is Docker's and the fakes' transport.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from apply_helpers import make_project

REPO = Path(__file__).resolve().parent.parent
TASK = (
    "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: hello}\nspec:\n  steps: [echo hello]\n"
)
NEVER = {
    "validate": ["asyncio", "logging", "ssl", "http.client", "sqlite3", "kagura_agent.memory"],
    "plan": ["asyncio", "logging"],
}
# The command as python -m kagura_agent runs it, then which of the modules it loaded.
PROBE = """
import json, runpy, sys
names = json.loads(sys.argv.pop(1))
sys.argv[0] = "kagura-agent"
code = 0
try:
    runpy.run_module("kagura_agent", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, [n for n in names if n in sys.modules]]), file=sys.stderr)
"""


@pytest.mark.usefixtures("without_docker")
@pytest.mark.parametrize("command", sorted(NEVER))
def test_validate_and_plan_do_not_import_what_they_do_not_use(tmp_path: Path, command: str) -> None:
    project = make_project(tmp_path)  # the agent's own: plan refuses a root it cannot write
    (project / "task.yml").write_text(TASK, encoding="utf-8")
    (tmp_path / "facts.json").write_text(
        json.dumps({"image_digests": {}, "graduation": {"version": 0}}), encoding="utf-8"
    )
    argv = {
        "validate": ["validate", "--manifests", str(REPO / "manifests"), str(project / "task.yml")],
        "plan": [
            "plan",
            "--manifests",
            str(REPO / "manifests"),
            "--facts",
            str(tmp_path / "facts.json"),
            str(project / "task.yml"),
        ],
    }[command]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(tmp_path / "cache"),  # empty: every check runs
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(NEVER[command]), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    code, loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert code in (0, None), done.stderr + done.stdout
    assert loaded == [], f"{command} imported {loaded}"
