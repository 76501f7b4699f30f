"""A run's agent sets setuid/setgid bits in the project root from inside a real container;
after apply exits none is left on the host (a setgid directory is kept: see
apply/setid.py), and the live view names what was cleared. After ``kill -9`` the next
apply's sweep of dead runs does it for the dead run's root."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    kagura,
    make_project,
    manifest_set,
    run_row,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)

pytestmark = pytest.mark.docker

SET_ID = stat.S_ISUID | stat.S_ISGID
ATTACK = (
    "cp /bin/true x && chmod 4755 x && cp /bin/true y && chmod 2755 y"
    " && mkdir d && chmod 2775 d && cp /bin/true d/z && chmod 6755 d/z"
    " && mkdir u && chmod 4775 u"
)


def _left(root: Path) -> list[tuple[str, str]]:
    """Entries under ``root`` that still carry a bit they must not (setgid dirs allowed)."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        bad = stat.S_ISUID if stat.S_ISDIR(mode) else SET_ID
        if mode & bad and not stat.S_ISLNK(mode):
            found.append((str(path.relative_to(root)), oct(stat.S_IMODE(mode))))
    return found


def test_setid_bits_the_agent_and_verify_set_are_cleared_on_the_host(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(
        project,
        "setid",
        {"steps": [ATTACK], "verify": ["cp /bin/true v && chmod 4755 v"]},
    )
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    assert (project / "x").exists() and (project / "v").exists()  # the steps ran
    assert _left(project) == []
    assert stat.S_IMODE((project / "x").stat().st_mode) == 0o755
    assert stat.S_IMODE((project / "d").stat().st_mode) == 0o2775  # kept, documented
    assert "cleared setuid/setgid on 5 file(s): " in done.stderr
    for name in ("x", "y", "d/z", "u", "v"):
        assert name in done.stderr


def test_after_kill_9_the_next_apply_clears_the_dead_runs_root(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path)
    first = make_project(tmp_path / "first")
    # A name the agent chose may carry a credential it held; its redactor dies with apply.
    leak = "Leak-5f3a9c2e7b1d"
    step = f"{ATTACK} && cp /bin/true {leak} && chmod 4755 {leak} && touch ready && sleep 600"
    task = write_task(first, "setid-dead", {"steps": [step]})
    env = cli_env(state_dir)
    proc = spawn(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    try:
        dead = wait_for_run(state_dir, proc)
        wait_for_container(docker_client, dead)
        deadline = time.monotonic() + 60
        while not (first / "ready").exists():
            assert time.monotonic() < deadline, "the step never ran"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert len(_left(first)) == 5  # nothing cleaned up after SIGKILL

    second = make_project(tmp_path / "second")
    task = write_task(second, "setid-next", {"steps": ["true"]})
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr
    assert _left(first) == []
    assert "cleared setuid/setgid on 5 file(s): names withheld" in done.stderr
    assert leak not in done.stdout + done.stderr  # the next run's redactor never knew it
    assert run_row(state_dir, dead)["outcome"] == "crashed"


def test_write_for_others_the_agent_sets_is_cleared_on_the_host(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """``chmod -R 777`` from inside the container: on the host any local user could then
    rewrite the script the operator runs next. Write for others is cleared, group kept."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    step = "printf 'echo hi' > run.sh && mkdir -p lib && touch lib/a && (chmod -R 777 . || true)"
    task = write_task(project, "world-write", {"steps": [step], "verify": ["true"]})
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    assert (project / "run.sh").exists()  # the step ran
    writable = [
        str(p.relative_to(project))
        for p in [project, *project.rglob("*")]
        if p.lstat().st_mode & stat.S_IWOTH and not p.is_symlink()
    ]
    assert writable == []
    assert stat.S_IMODE((project / "run.sh").stat().st_mode) == 0o775
    assert "cleared write for others on " in done.stderr
