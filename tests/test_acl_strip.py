"""The ACL half of the host-side walk (apply/aftercare/acl.py, apply/aftercare/setid.py), unit
level: the
xattr parser, and on a real file system what a run added is removed while the ACLs an
operator set before it (and what new files inherit from them) stay."""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from apply_helpers import plan_for_root

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.acl import (
    GROUP,
    GROUP_OBJ,
    MASK,
    OTHER,
    UNDEFINED_ID,
    USER,
    USER_OBJ,
)
from kagura_agent.apply.aftercare.setid import CTIME_SLACK, clear_setid, ctime_floor
from kagura_agent.apply.records.runs import open_run, sweep_dead_runs
from kagura_agent.clock import FixedClock
from kagura_agent.state import open_store

U = UNDEFINED_ID
TEAM = 4242  # a group id; it needs no name on the host
STRANGER = 31337  # a user id


def _base(user: int = 7, group: int = 5, other: int = 5) -> list[acl.Entry]:
    return [(USER_OBJ, user, U), (GROUP_OBJ, group, U), (OTHER, other, U)]


def _named(*extra: acl.Entry, mask: int = 7) -> list[acl.Entry]:
    return sorted([*_base(), *extra, (MASK, mask, U)])


def _set(path: Path, name: str, entries: list[acl.Entry]) -> None:
    os.setxattr(path, name, acl.build(entries))


def _get(path: Path, name: str) -> list[acl.Entry] | None:
    return acl.read(str(path), name, follow=True)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    try:
        _set(project, acl.ACCESS, _named((USER, 7, STRANGER)))
        os.removexattr(project, acl.ACCESS)
    except OSError as exc:  # a failure, not a skip: these tests need ACLs
        assert exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP), (
            f"{tmp_path} has no POSIX ACL support: run the tests on a file system that has"
        )
        raise
    return project


def test_parse_and_build_are_the_kernels_format() -> None:
    raw = struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", *e)
        for e in [(1, 7, U), (2, 6, 1000), (4, 5, U), (8, 7, 42), (0x10, 7, U), (0x20, 4, U)]
    )
    entries = acl.parse(raw)
    assert entries == [
        (USER_OBJ, 7, U),
        (USER, 6, 1000),
        (GROUP_OBJ, 5, U),
        (GROUP, 7, 42),
        (MASK, 7, U),
        (OTHER, 4, U),
    ]
    assert acl.build(list(reversed(entries))) == raw  # sorted as the kernel requires


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x02\x00\x00", struct.pack("<I", 1) + struct.pack("<HHI", 1, 7, U), b"\x02\0\0\0\1"],
)
def test_a_malformed_acl_is_refused(raw: bytes) -> None:
    with pytest.raises(acl.AclError):
        acl.parse(raw)


def test_strip_keeps_what_the_folder_allows_and_narrows_the_group() -> None:
    team = acl.allowed(_named((GROUP, 7, TEAM)))
    inherited = _named((GROUP, 7, TEAM), mask=5)
    assert acl.strip_access(inherited, team) is None
    added = _named((GROUP, 7, TEAM), (USER, 7, STRANGER))
    assert acl.strip_access(added, team) == _named((GROUP, 7, TEAM))
    # nothing allowed: the mask goes, the owning group keeps group_obj & mask
    alone = sorted([(USER_OBJ, 7, U), (GROUP_OBJ, 7, U), (OTHER, 0, U), (USER, 7, STRANGER)])
    alone.append((MASK, 5, U))
    assert acl.strip_access(alone, None) == [(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 0, U)]
    more = _named((GROUP, 7, TEAM))
    assert acl.strip_access(more, acl.allowed(_named((GROUP, 5, TEAM)))) is not None
    assert acl.within(_named((GROUP, 5, TEAM)), team)
    assert not acl.within(_named((GROUP, 7, TEAM), (USER, 4, STRANGER)), team)
    assert not acl.within(_base(), None)


def test_acls_the_run_added_are_removed_and_named(root: Path) -> None:
    snap = acl.snapshot(str(root))
    since = ctime_floor()
    (root / "f").write_text("x")
    _set(root / "f", acl.ACCESS, _named((USER, 7, STRANGER)))
    (root / "d").mkdir()
    _set(root / "d", acl.DEFAULT, _named((USER, 7, STRANGER)))
    (root / "d" / "g").write_text("x")  # inherits the stranger from the default ACL
    os.chmod(root / "d" / "g", 0o400)  # unreadable to its owner: reached by O_PATH
    _set(root, acl.ACCESS, _named((GROUP, 7, TEAM)))  # the root itself
    report = clear_setid(str(root), since, root_acl=snap)
    assert sorted(report.acl_removed.shown) == [".", "d", "d/g", "f"]
    for path in (root, root / "f", root / "d", root / "d" / "g"):
        assert _get(path, acl.ACCESS) is None, path
    assert _get(root / "d", acl.DEFAULT) is None
    assert stat.S_IMODE((root / "f").stat().st_mode) & 0o070 == 0o050  # group not widened
    [line] = report.summary()
    assert line.startswith("removed ACL entries granting other users on 4 entries: ")


def test_a_team_default_acl_from_before_the_run_and_what_inherits_it_survive(
    root: Path,
) -> None:
    team = _named((GROUP, 7, TEAM))
    shared = root / "shared"
    shared.mkdir()
    _set(shared, acl.DEFAULT, team)
    _set(root, acl.DEFAULT, team)  # on the root as well: kept through the snapshot
    (root / "old").write_text("x")
    _set(root / "old", acl.ACCESS, _named((USER, 7, STRANGER)))  # before the run: not ours
    snap = acl.snapshot(str(root))
    time.sleep(1.2)
    since = int(time.time())  # everything above is older than the run
    (shared / "new.py").write_text("x")  # inherits the team's entries
    (shared / "sub").mkdir()  # inherits the default ACL too
    (shared / "sub" / "deep").write_text("x")
    (root / "top").write_text("x")  # changes the root's ctime
    (root / "mine").mkdir()
    _set(root / "mine", acl.DEFAULT, [*team, (USER, 7, STRANGER)])  # beyond the team's
    report = clear_setid(str(root), since, root_acl=snap)
    assert report.acl_removed.shown == ("mine",)
    assert _get(root, acl.DEFAULT) == team
    assert _get(shared, acl.DEFAULT) == team
    assert _get(shared / "sub", acl.DEFAULT) == team
    for path in (shared / "new.py", shared / "sub" / "deep", root / "top", shared / "sub"):
        got = _get(path, acl.ACCESS)
        assert got is not None and (GROUP, 7, TEAM) in got, path
    assert _get(root / "mine", acl.DEFAULT) == team  # reset to what mkdir would give
    assert _get(root / "old", acl.ACCESS) is not None


def test_without_a_snapshot_the_roots_own_acl_is_kept(root: Path) -> None:
    since = ctime_floor()
    _set(root, acl.ACCESS, _named((GROUP, 7, TEAM)))
    assert not clear_setid(str(root), since).acl_removed
    assert _get(root, acl.ACCESS) is not None


def test_a_symlink_to_a_file_with_an_acl_is_not_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("x")
    _set(outside, acl.ACCESS, _named((USER, 7, STRANGER)))
    since = ctime_floor()
    (root / "link").symlink_to(outside)
    report = clear_setid(str(root), since, root_acl=acl.snapshot(str(root)))
    assert not report.acl_removed
    assert _get(outside, acl.ACCESS) is not None


def test_a_folders_own_acls_recorded_at_the_start_survive_the_run_writing_in_it(
    root: Path,
) -> None:
    """The run adds a file in the team's folder (changing the folder's ctime): the folder's
    default and access ACLs were recorded at the start and stay; one it adds goes."""
    team = _named((GROUP, 7, TEAM))
    shared = root / "shared"
    shared.mkdir()
    _set(shared, acl.DEFAULT, team)
    _set(shared, acl.ACCESS, team)
    (root / "plain").mkdir()
    snap = acl.snapshot(str(root))
    assert set(json.loads(snap)["dirs"]) == {str(shared.stat().st_ino)}
    time.sleep(1.2)
    since = int(time.time())
    (shared / "new.py").write_text("x")
    _set(root / "plain", acl.DEFAULT, team)  # not the root's: it has none
    report = clear_setid(str(root), since, root_acl=snap)
    assert report.acl_removed.shown == ("plain",)
    assert _get(shared, acl.DEFAULT) == team and _get(shared, acl.ACCESS) == team
    got = _get(shared / "new.py", acl.ACCESS)
    assert got is not None and (GROUP, 7, TEAM) in got
    assert _get(root / "plain", acl.DEFAULT) is None


class _NoContainers:
    def list(self, labels: dict[str, str]) -> list[str]:
        return []

    def remove(self, container_id: str, *, force: bool = False) -> None:
        raise AssertionError("nothing to remove")


@pytest.mark.usefixtures("without_docker")
def test_after_kill_9_the_sweep_uses_the_acls_recorded_when_the_run_opened(
    root: Path, tmp_path: Path, state_dir: Path
) -> None:
    """The dead run's row holds the record: the next apply's sweep keeps the team's folder
    ACLs (its ctime changed) and removes the one the run added."""
    team = _named((GROUP, 7, TEAM))
    shared = root / "shared"
    shared.mkdir()
    _set(shared, acl.DEFAULT, team)
    time.sleep(CTIME_SLACK + 1.1)
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    row = plan_for_root(tmp_path, root)
    with open_store() as store:
        open_run(store, row, "run-dead", clock, root_acl=acl.snapshot(str(root)))
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    (shared / "new.py").write_text("x")
    (root / "f").write_text("x")
    _set(root / "f", acl.ACCESS, _named((USER, 7, STRANGER)))
    said: list[str] = []
    with open_store() as store:
        swept = sweep_dead_runs(
            store,
            _NoContainers(),
            clock,
            lambda finding: said.append(finding.message),
        )
    assert swept == ["run-dead"]
    assert _get(root / "f", acl.ACCESS) is None
    assert _get(shared, acl.DEFAULT) == team
    got = _get(shared / "new.py", acl.ACCESS)
    assert got is not None and (GROUP, 7, TEAM) in got
    assert (
        "removed ACL entries granting other users on 1 entry: names withheld (the run was killed)"
        in said
    ), said
