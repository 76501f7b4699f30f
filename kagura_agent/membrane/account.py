"""Who owns a project root root makes: the dedicated, unprivileged ``kagura-agent`` account.

The agent never runs as root: it runs as its project root's owner. A project root made
by root is root's, and the old way out (``chown -R 1000:1000``) handed it to whoever is
uid 1000 on this host. ``kagura-agent init`` run as root gives the new project to a
system account of its own instead: no password, no login shell, no home, owning nothing
but the projects made for it, so what the agent writes belongs to an account that is
nobody else. It is created the first time it is needed (``useradd --system``); a root
operator may use a project root it owns (membrane/roots.py), as one of a regular user's.
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass

from kagura_agent import hostproc
from kagura_agent.errors import SetupError, UsageError

AGENT_ACCOUNT = "kagura-agent"
_NOLOGIN = next(
    (p for p in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false") if os.path.exists(p)),
    "/bin/false",
)
# Regular users: a root operator may hand a project to one of them (--as), as roots.py
# lets root use a regular user's folder. System accounts and nobody are services' own.
REGULAR_UIDS = range(1000, 65534)


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


def agent_account_uid() -> int | None:
    """The dedicated account's uid, or None when this host has none."""
    try:
        return pwd.getpwnam(AGENT_ACCOUNT).pw_uid
    except KeyError:
        return None


def project_owner(name: str) -> Account:
    """The unprivileged account named ``name`` (``init --as``): a regular user or the
    dedicated account, never root, a system account or nobody."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise UsageError(
            f"--as {name}: no such user on this host",
            hint=f"omit --as to use the dedicated account {AGENT_ACCOUNT}",
        ) from None
    if entry.pw_name != AGENT_ACCOUNT and entry.pw_uid not in REGULAR_UIDS:
        raise UsageError(
            f"--as {name}: uid {entry.pw_uid} is root, a system account or nobody; the agent"
            " runs as its project's owner and must be an unprivileged user of its own",
            hint=f"omit --as to use the dedicated account {AGENT_ACCOUNT}",
        )
    if entry.pw_gid == 0:
        raise UsageError(f"--as {name}: its primary group is root's (gid 0)")
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def ensure_agent_account() -> tuple[Account, bool]:
    """The dedicated account, created when this host has none: (account, created)."""
    try:
        entry = pwd.getpwnam(AGENT_ACCOUNT)
    except KeyError:
        pass
    else:
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise SetupError(
                f"the account {AGENT_ACCOUNT} has uid {entry.pw_uid} and gid {entry.pw_gid}:"
                " root's; the agent's account must be unprivileged",
                hint=f"remove it (userdel {AGENT_ACCOUNT}) and run this again, or pass --as USER",
            )
        return Account(entry.pw_name, entry.pw_uid, entry.pw_gid), False
    useradd = shutil.which("useradd") or next(
        (p for p in ("/usr/sbin/useradd", "/sbin/useradd") if os.access(p, os.X_OK)), None
    )
    if useradd is None:
        raise SetupError(
            f"the unprivileged account {AGENT_ACCOUNT} does not exist and there is no"
            " useradd here to create it",
            hint=f"create a system account named {AGENT_ACCOUNT} (no login, no home) with"
            " your system's tools, or pass --as USER for a regular user's",
        )
    argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir"]
    argv += ["/nonexistent", "--shell", _NOLOGIN, "--comment", "kagura-agent projects"]
    done = hostproc.run(
        [*argv, AGENT_ACCOUNT],
        env=hostproc.environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    try:
        entry = pwd.getpwnam(AGENT_ACCOUNT)
    except KeyError:
        said = (done.stderr or done.stdout).strip()[-300:]
        raise SetupError(
            f"could not create the account {AGENT_ACCOUNT} (useradd exit {done.returncode}:"
            f" {said or 'no output'})",
            hint="create it with your system's tools, or pass --as USER",
        ) from None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid), done.returncode == 0
