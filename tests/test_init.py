"""``kagura-agent init NAME [DIR]``: a project of one's own, and as root never root's.

Before: the quickstart planned ``examples/hello`` of the checkout; as root in a root-owned
checkout that plan exited 6 ("the project root is owned by root … fix: chown -R 1000:1000
…"), and the fix handed the checkout to whoever is uid 1000 on the host. ``init`` makes a
new folder instead: the user's own, or as root the dedicated unprivileged account's
(``kagura-agent``, made the first time) or ``--as USER``'s, and never touches anything else.
The README's five commands run end to end in tests/test_readme.py.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import REPO, cli_env, kagura

from kagura_agent.membrane.account import AGENT_ACCOUNT, agent_account_uid
from kagura_agent.membrane.roots import check_project_root

USER_UID = 65534  # nobody: a normal user for the tests that need one
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="making a folder for another user needs root"
)


def _plan(task: Path, state_dir: Path) -> dict[str, object]:
    done = kagura(["plan", "--json", str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)["plans"]
    plan: dict[str, object] = entry["plan"]
    return plan


@as_root
@pytest.mark.usefixtures("without_docker")
def test_init_as_root_gives_a_new_folder_to_the_agent_account(
    tmp_path: Path, state_dir: Path
) -> None:
    checkout = tmp_path / "checkout"  # root's, as a checkout made by root
    checkout.mkdir()
    done = kagura(["init", "hello", str(checkout / "hello")], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    uid = agent_account_uid()
    assert uid is not None and uid != 0
    account = pwd.getpwnam(AGENT_ACCOUNT)
    assert account.pw_shell.endswith(("nologin", "false")) and account.pw_gid != 0
    project = checkout / "hello"
    assert (project.stat().st_uid, project.stat().st_gid) == (uid, account.pw_gid)
    assert f"owned by {AGENT_ACCOUNT}, uid {uid}" in done.stdout
    task = project / "task.yml"
    assert task.stat().st_uid == 0 and task.stat().st_mode & 0o777 == 0o644  # the operator's
    assert checkout.stat().st_uid == 0  # nothing else changed hands
    plan = _plan(task, state_dir)
    assert plan["applyable"] is True
    assert plan["hardening"]["user"] == f"{uid}:{account.pw_gid}"  # type: ignore[index]


@as_root
@pytest.mark.usefixtures("without_docker")
def test_init_as_names_a_regular_user_never_root_or_a_system_account(
    tmp_path: Path, state_dir: Path
) -> None:
    env = cli_env(state_dir)
    for who in ("root", "daemon", "nobody", "no-such-user-here"):
        done = kagura(["init", "hello", str(tmp_path / who), "--as", who], env)
        assert done.returncode == 2, (who, done.stderr)
        assert f"--as {who}" in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / who).exists()
    done = kagura(["init", "hello", str(tmp_path / "ok"), "--as", AGENT_ACCOUNT], env)
    assert done.returncode == 0, done.stderr


@pytest.mark.usefixtures("without_docker")
def test_init_never_overwrites_and_leaves_nothing_behind(tmp_path: Path, state_dir: Path) -> None:
    env = cli_env(state_dir)
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("a file")
    for target, said in (
        (used, "is not empty"),
        (tmp_path / "file", "is not a folder"),
        (tmp_path / "missing" / "hello", "does not exist"),
    ):
        done = kagura(["init", "hello", str(target)], env)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and "nothing was written" in done.stderr
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
    assert (tmp_path / "file").read_text() == "a file"
    assert not (tmp_path / "missing").exists()
    done = kagura(["init", "Hello_World", str(tmp_path / "x")], env)
    assert done.returncode == 2 and "a task name is" in done.stderr
    assert not (tmp_path / "x").exists()
    # A place no project root may be (here: inside the state directory) is refused and
    # what was made is gone again.
    state_dir.mkdir(parents=True, exist_ok=True)
    done = kagura(["init", "hello", str(state_dir / "hello")], env)
    assert done.returncode == 6, done.stderr
    assert "the kagura-agent state directory" in done.stderr
    assert not (state_dir / "hello").exists()
    # An empty folder is taken as it is.
    empty = tmp_path / "empty"
    empty.mkdir()
    done = kagura(["init", "hello", str(empty), "--json"], env)
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["ok"] is True and made["errors"] == []
    assert made["project"] == str(empty) and made["task"] == str(empty / "task.yml")
    assert made["owner"]["uid"] == empty.stat().st_uid
    assert (empty / "task.yml").is_file()


@pytest.fixture()
def user_home() -> Iterator[Path]:
    """A folder of the normal user's own, outside pytest's (closed to other users)."""
    home = Path(tempfile.mkdtemp(prefix="kagura-init-"))
    if os.geteuid() == 0:
        os.chown(home, USER_UID, USER_UID)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.usefixtures("without_docker")
def test_init_as_a_normal_user_makes_the_folder_theirs(user_home: Path) -> None:
    env = {
        **cli_env(user_home / "state"),
        "HOME": str(user_home),
        "PYTHONPATH": str(REPO),
    }
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("tests run as root and setpriv (util-linux) is missing")
        prefix = [setpriv, f"--reuid={USER_UID}", f"--regid={USER_UID}", "--clear-groups"]

    def init(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*prefix, sys.executable, "-m", "kagura_agent", "init", *args]
        return subprocess.run(
            argv, cwd=user_home, env=env, capture_output=True, text=True, timeout=120
        )

    done = init("hello")
    assert done.returncode == 0, done.stderr
    me = USER_UID if prefix else os.geteuid()
    assert (user_home / "hello").stat().st_uid == me
    assert (user_home / "hello" / "task.yml").stat().st_uid == me
    refused = init("other", "--as", AGENT_ACCOUNT)
    assert refused.returncode == 2 and "--as USER needs root" in refused.stderr
    assert not (user_home / "other").exists()


@as_root
def test_a_root_operator_may_use_the_agent_accounts_folder_and_no_other_system_account(
    tmp_path: Path,
) -> None:
    done = kagura(["init", "hello", str(tmp_path / "mine")], cli_env(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert check_project_root(str(tmp_path / "mine")) is None
    daemon = tmp_path / "daemon"
    daemon.mkdir()
    os.chown(daemon, 1, 1)  # a service's account: never the agent's
    problem = check_project_root(str(daemon))
    assert problem is not None and "not by the operator" in problem
