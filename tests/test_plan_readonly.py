"""``plan``, ``validate`` and ``show`` never create or migrate state (issue 17, item 6).

The state directory is made read-only (0555, its files 0444) and the commands run in a
subprocess that the kernel holds to those bits: as the current user when it is not
root, and as root *without* CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER (via
``setpriv``) when it is, since root ignores permission bits. Whoever runs them, the
directory listing, every file's bytes and mtime, and the directory's own mtime must be
the same afterwards; a state directory that does not exist must still not exist.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from kagura_agent.graduation import ledger
from kagura_agent.memory.sqlite import SqliteMemoryStore
from kagura_agent.paths import MEMORY_FILE
from kagura_agent.patterns.failure_learning import record_failure
from kagura_agent.plan import history
from kagura_agent.plan.build import plan_tasks
from kagura_agent.state import STATE_FILE, StateStore

REPO = Path(__file__).resolve().parents[1]
TASK = str(REPO / "examples" / "hello" / "task.yml")
# Capabilities that let root ignore file permission bits.
_DAC = "-dac_override,-dac_read_search,-fowner"


def _unprivileged() -> list[str]:
    """The argv prefix under which permission bits bind this process."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("tests run as root and setpriv (util-linux) is missing")
    return [setpriv, f"--inh-caps={_DAC}", f"--bounding-set={_DAC}"]


def _kagura(args: list[str], state: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAGURA_AGENT_STATE_DIR": str(state),
        "KAGURA_AGENT_CACHE_DIR": str(tmp_path / "cache"),  # the check cache is not state
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [*_unprivileged(), sys.executable, "-m", "kagura_agent", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """{name: (mode, mtime_ns, bytes)} of the folder ("." is the folder itself)."""
    found = {".": (folder.stat().st_mode, folder.stat().st_mtime_ns, b"")}
    for path in sorted(folder.iterdir()):
        info = path.stat()
        found[path.name] = (info.st_mode, info.st_mtime_ns, path.read_bytes())
    return found


def _make_state(state: Path, *, old_schema: bool = False) -> None:
    """A state directory with real content, written by the write paths and closed."""
    state.mkdir()
    [plan] = plan_tasks(None, [TASK])
    with StateStore(state / STATE_FILE) as store:
        history.record_applied(store, plan, "2026-12-01T00:00:00Z")
        if old_schema:
            store.migrate("graduation", ledger.MIGRATIONS[:1])  # an older kagura-agent's
        else:
            ledger.migrate(store)
    memory = SqliteMemoryStore(state / MEMORY_FILE)
    record_failure(
        memory, run_id="run-0", task_kind="hello", summary="echo: disk full", trust="trusted"
    )
    memory.close()
    if old_schema:
        with closing(sqlite3.connect(state / MEMORY_FILE)) as conn, conn:
            conn.execute("UPDATE schema_versions SET version = 2 WHERE component = 'memory'")
    assert sorted(p.name for p in state.iterdir()) == [MEMORY_FILE, STATE_FILE]


@pytest.fixture()
def read_only_state(tmp_path: Path, state_dir: Path) -> Iterator[Path]:
    _make_state(state_dir)
    yield _lock(state_dir)
    _unlock(state_dir)


def _lock(state: Path) -> Path:
    for path in state.iterdir():
        path.chmod(0o444)
    state.chmod(0o555)
    return state


def _unlock(state: Path) -> None:
    state.chmod(0o755)
    for path in state.iterdir():
        path.chmod(0o644)


@pytest.mark.usefixtures("without_docker")
def test_permission_bits_bind_the_commands(read_only_state: Path, tmp_path: Path) -> None:
    """The control: under the same privileges a write into the state dir is refused."""
    done = subprocess.run(
        [*_unprivileged(), sys.executable, "-c", f"open({str(read_only_state / 'x')!r}, 'w')"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "PermissionError" in done.stderr, done.stderr


@pytest.mark.usefixtures("without_docker")
def test_plan_validate_show_on_a_read_only_state_dir(read_only_state: Path, tmp_path: Path) -> None:
    before = _snapshot(read_only_state)
    saved = tmp_path / "saved.json"
    plan = _kagura(
        ["plan", "--allow-unapplyable", TASK, "-o", str(saved)], read_only_state, tmp_path
    )
    assert plan.returncode == 0, plan.stderr
    # It read the store: the last applied plan (no changes) and the known failure.
    assert "no changes against the last applied plan" in plan.stdout, plan.stdout
    assert "echo: disk full" in plan.stdout, plan.stdout
    as_json = _kagura(["plan", "--allow-unapplyable", TASK, "--json"], read_only_state, tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    compiled = json.loads(as_json.stdout)["plans"][0]["plan"]
    assert not any("older than" in w for w in compiled["warnings"])
    for args in (["validate"], ["validate", TASK], ["show", str(saved)]):
        done = _kagura(args, read_only_state, tmp_path)
        assert done.returncode == 0, (args, done.stderr)
    assert _snapshot(read_only_state) == before


@pytest.mark.usefixtures("without_docker")
def test_no_state_dir_is_not_created(tmp_path: Path) -> None:
    absent = tmp_path / "no-state"
    saved = tmp_path / "saved.json"
    for args in (
        ["plan", "--allow-unapplyable", TASK, "-o", str(saved)],
        ["validate", TASK],
        ["show", str(saved)],
    ):
        done = _kagura(args, absent, tmp_path)
        assert done.returncode == 0, (args, done.stderr)
        assert not absent.exists(), args


@pytest.mark.usefixtures("without_docker")
def test_an_older_schema_is_read_fail_closed_and_not_migrated(
    tmp_path: Path, state_dir: Path
) -> None:
    """Graduation at v1 and memory at v2 (older than this tool's): plan neither migrates
    nor fails; it ignores what it cannot read, says so, and treats it as absent."""
    _make_state(state_dir, old_schema=True)
    before = _snapshot(_lock(state_dir))
    try:
        done = _kagura(["plan", "--allow-unapplyable", TASK, "--json"], state_dir, tmp_path)
        assert done.returncode == 0, done.stderr
        warnings = json.loads(done.stdout)["plans"][0]["plan"]["warnings"]
        assert any("graduation schema v1" in w for w in warnings), warnings
        assert any("memory schema v2" in w for w in warnings), warnings
        assert _snapshot(state_dir) == before
    finally:
        _unlock(state_dir)
    with closing(sqlite3.connect(state_dir / STATE_FILE)) as conn:
        versions = dict(conn.execute("SELECT component, version FROM schema_versions"))
    assert versions["graduation"] == 1


@pytest.mark.usefixtures("without_docker")
def test_a_store_a_writer_holds_open_is_read_through_its_wal(
    tmp_path: Path, state_dir: Path
) -> None:
    """While apply holds state.db open, its last commits are still in the WAL: plan reads
    them (mode=ro through the existing -wal/-shm) and adds no file of its own."""
    state_dir.mkdir()
    [plan] = plan_tasks(None, [TASK])
    writer = StateStore(state_dir / STATE_FILE)
    try:
        history.record_applied(writer, plan, "2026-12-01T00:00:00Z")
        names = sorted(p.name for p in state_dir.iterdir())
        assert names == [STATE_FILE, STATE_FILE + "-shm", STATE_FILE + "-wal"]
        main_file = (state_dir / STATE_FILE).read_bytes()
        done = subprocess.run(
            [sys.executable, "-m", "kagura_agent", "plan", "--allow-unapplyable", TASK],
            env={**os.environ, "KAGURA_AGENT_STATE_DIR": str(state_dir), "NO_COLOR": "1"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert "no changes against the last applied plan" in done.stdout, done.stdout
        assert sorted(p.name for p in state_dir.iterdir()) == names
        assert (state_dir / STATE_FILE).read_bytes() == main_file  # nothing checkpointed
    finally:
        writer.close()
