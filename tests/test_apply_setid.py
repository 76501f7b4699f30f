"""A run's agent sets setuid/setgid bits in the project root from inside a real container;
after apply exits none is left on the host (a setgid directory is kept: see
apply/aftercare/setid.py), and the live view names what was cleared. After ``kill -9`` the next
apply's sweep of dead runs does it for the dead run's root."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    kagura,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)

pytestmark = pytest.mark.usefixtures("docker_client")

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


# The agent's worst tree: a chain of 300 directories with 20-character names (its path,
# some 6,300 characters, is past PATH_MAX; the old walk stopped at 256 levels and left
# the bottom as "could not reach 1 entry"), a setuid file at its bottom with a hard link,
# a FIFO and a socket beside it; names with a newline and an escape; directories
# chmod 000 with setuid files inside; symlinks out of the root.
DEEP = "dddddddddddddddddddd"
DEEP_TREE = (
    "set -e; top=$PWD;"
    f" for i in $(seq 300); do mkdir {DEEP}; cd {DEEP}; done;"
    " cp /bin/true x; chmod 4755 x; ln x hard; mkfifo fifo;"
    " python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")';"
    ' cd "$top";'
    " cp /bin/true \"$(printf 'evil\\nline\\033[2J')\"; chmod 6755 \"$(printf 'evil\\nline\\033[2J')\";"
    " mkdir -p locked/inner; cp /bin/true locked/inner/s; chmod 4755 locked/inner/s;"
    " chmod 000 locked/inner locked;"
    f" chmod 000 {DEEP};"
    " ln -s /etc/passwd passwd; ln -s / up"
)


def _set_id_files(root: Path) -> list[str]:
    """Every setuid/setgid regular file under ``root``, by GNU find (any depth)."""
    found = subprocess.run(
        [
            "find",
            str(root),
            "-xdev",
            "-type",
            "f",
            "(",
            "-perm",
            "-4000",
            "-o",
            "-perm",
            "-2000",
            ")",
            "-print0",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in found.stdout.split("\0") if name]


def test_a_tree_of_any_depth_and_shape_is_cleared_to_its_end(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(project, "deep", {"steps": [DEEP_TREE]})
    try:
        done = kagura(
            ["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir)
        )
        assert done.returncode == 0, done.stderr
        assert (project / "passwd").is_symlink()  # the step ran to its end
        assert _set_id_files(project) == []
        assert (
            "cleared setuid/setgid on 3 file(s): " in done.stderr
        )  # x (one inode with hard), evil, s
        assert "could not" not in done.stderr and "QUARANTINED" not in done.stderr
        assert "\x1b" not in done.stderr
        # What the agent chmod'ed 000 keeps its mode: the walk only clears bits.
        assert stat.S_IMODE((project / "locked").lstat().st_mode) == 0
        assert stat.S_IMODE((project / DEEP).lstat().st_mode) == 0
        assert stat.S_IMODE(os.stat("/etc/passwd").st_mode) == 0o644  # never followed
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(project)], check=False)
        subprocess.run(["rm", "-rf", str(project)], check=False)


def test_a_root_the_walk_cannot_finish_is_quarantined_until_checked_again(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """An entry the walk cannot change (here: made immutable on the host while the run
    ran, so even root's chmod fails): the run fails, in red, the root is closed to other
    users, the next apply is refused with the command that lifts it, and that command
    works once the entry can be fixed — and then the next apply runs."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    mode_before = stat.S_IMODE(project.stat().st_mode)
    step = (
        "cp /bin/true stuck && chmod 4755 stuck && touch ready"
        " && for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done"
    )
    task = write_task(project, "stuck", {"steps": [step]})
    env = cli_env(state_dir)
    stuck = project / "stuck"
    try:
        proc = spawn(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
        deadline = time.monotonic() + 120
        while not (project / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the step never ran"
            time.sleep(0.1)
        subprocess.run(["chattr", "+i", str(stuck)], check=True)
        (project / "go").touch()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, out
        assert f"QUARANTINED {project.resolve()}: the aftercare could not check 1 entry" in out
        assert "The run is failed." in out
        assert f"to check it again and lift this: kagura-agent aftercare {project.resolve()}" in out
        assert stat.S_IMODE(project.stat().st_mode) == mode_before & 0o700
        assert stuck.stat().st_mode & stat.S_ISUID  # what could not be cleared…
        [run_id] = run_ids(state_dir)
        assert run_row(state_dir, run_id)["outcome"] == "failed"

        again = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
        assert again.returncode == 6, again.stderr
        assert "is quarantined since" in again.stderr
        hint = f"kagura-agent aftercare {project.resolve()}"
        assert hint in again.stderr

        # The hint, followed while the entry still cannot be fixed: it says which.
        still = kagura(["aftercare", str(project)], env)
        assert still.returncode == 6, still.stderr
        assert "stays quarantined" in still.stderr and "stuck (" in still.stderr
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
        lifted = kagura(["aftercare", str(project), "--json"], env)
        assert lifted.returncode == 0, lifted.stderr
        body = json.loads(lifted.stdout)
        assert body["ok"] and body["lifted"] and body["cleared"] == 1
        assert stat.S_IMODE(stuck.stat().st_mode) == 0o755
        assert stat.S_IMODE(project.stat().st_mode) == mode_before

        (project / "go").unlink()
        after = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
        assert after.returncode == 0, after.stderr
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=False)
