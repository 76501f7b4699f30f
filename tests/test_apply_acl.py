"""A run's agent adds POSIX ACL entries in the project root from inside a real container
(a named user on a file, a default ACL on a folder it makes); after apply exits they are
gone on the host and the live view names them, while a team's default ACL set by the
operator before the run, and the files the run made under it (which inherit it), stay."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.acl import GROUP, GROUP_OBJ, MASK, OTHER, USER_OBJ
from kagura_agent.apply.aftercare.setid import CTIME_SLACK

pytestmark = pytest.mark.usefixtures("docker_client")

U = acl.UNDEFINED_ID
TEAM = [(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (GROUP, 7, 4242), (MASK, 7, U), (OTHER, 5, U)]

# Run by the agent's own python3 (the image has no setfacl): the same bytes setfacl writes.
ATTACK = """\
import os, struct
U = 0xFFFFFFFF
def acl(*named):
    entries = sorted([(1, 7, U), (4, 5, U), (0x10, 7, U), (0x20, 5, U), *named])
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
open("granted", "w").write("x")
os.setxattr("granted", "system.posix_acl_access", acl((2, 7, 31337)))
os.mkdir("spread")
os.setxattr("spread", "system.posix_acl_default", acl((2, 7, 31337)))
open("spread/child", "w").write("x")
open("shared/made.py", "w").write("x")
os.mkdir("shared/sub")
open("shared/sub/deep.py", "w").write("x")
"""


def _acl(path: Path, name: str) -> list[acl.Entry] | None:
    return acl.read(str(path), name, follow=True)


def test_acl_entries_the_agent_adds_are_removed_and_a_team_acl_stays(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    shared = project / "shared"
    shared.mkdir()
    try:
        os.setxattr(shared, acl.DEFAULT, acl.build(TEAM))
    except OSError as exc:  # fail, never skip: this test needs a file system with ACLs
        assert exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP), f"no ACLs on {tmp_path}"
        raise
    if os.geteuid() == 0:
        os.chown(shared, 1000, 1000)
    (project / "attack.py").write_text(ATTACK)
    # older than the run's ctime bound (its slack: setid.CTIME_SLACK), as a team's is
    time.sleep(CTIME_SLACK + 1.1)
    task = write_task(project, "acl", {"steps": ["python3 attack.py"], "verify": ["true"]})
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    assert (project / "spread" / "child").exists()  # the step ran
    for path in ("granted", "spread", "spread/child"):
        assert _acl(project / path, acl.ACCESS) is None, path
    assert _acl(project / "spread", acl.DEFAULT) is None
    assert "removed ACL entries granting other users on 3 entries: " in done.stderr
    for name in ("granted", "spread", "spread/child"):
        assert name in done.stderr
    # the team's: the folder's default ACL, and what the run's new entries inherited
    assert _acl(shared, acl.DEFAULT) == TEAM
    assert _acl(shared / "sub", acl.DEFAULT) == TEAM
    for path in ("made.py", "sub", "sub/deep.py"):
        got = _acl(shared / path, acl.ACCESS)
        assert got is not None and (GROUP, 7, 4242) in got, path
    assert "shared" not in done.stderr.split("removed ACL entries")[1].splitlines()[0]
