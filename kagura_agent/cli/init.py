"""kagura-agent init NAME [DIR]: a project folder of one's own, with a first task in it.

The agent never runs as root: it runs as its project root's owner. Run by a normal user,
the new folder is theirs. Run by root, it belongs to an unprivileged account — the
dedicated ``kagura-agent`` account (created the first time, membrane/account.py), or the
regular user named with ``--as`` — so root's first apply needs no chown of anything, and
no folder is handed to whoever holds some uid. The task file itself stays the operator's.

Nothing is overwritten: DIR must not exist (its parent must) or be an empty folder. The
folder must be one a project root may be (membrane/roots.py); when it is not, what was
made is removed again and the reason is the error.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shlex
from pathlib import Path
from typing import Any

from kagura_agent.errors import RefusedError, UsageError

TASK_FILE = "task.yml"
# A Task's metadata.name (schemas/task.json).
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
STARTER = """\
# A first task. No `brain:` and a list of `steps`: the script brain runs these shell
# steps in the agent's container behind the membrane (no model, no network, no
# credentials); `verify` then decides whether the run succeeded. For an LLM brain, give a
# `prompt:` instead of steps (the packaged `claude` brain needs ANTHROPIC_API_KEY).
apiVersion: kagura.dev/v1
kind: Task
metadata: {{name: {name}}}
spec:
  steps:
    - echo "hello from uid $(id -u) in $(pwd)" > hello.txt
  verify:
    - grep -q hello hello.txt
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "init",
        help="a project folder of your own with a first task (as root: owned by an"
        " unprivileged account, never root)",
    )
    parser.add_argument("name", metavar="NAME", help="the task's name (a-z, 0-9, -)")
    parser.add_argument(
        "dir", nargs="?", metavar="DIR", help="the project folder to make (default: ./NAME)"
    )
    parser.add_argument(
        "--as",
        dest="owner",
        metavar="USER",
        help="as root: the regular user who owns the project (and whom the agent runs as);"
        " default: the dedicated unprivileged account kagura-agent, made if missing",
    )
    parser.add_argument("--json", action="store_true", help="print what was made as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.common import print_ok

    made = init_project(args.name, Path(args.dir or args.name), owner=args.owner)
    if args.json:
        print_ok(made)
        return 0
    if made["account_created"]:
        owner = made["owner"]
        print(
            f"created the unprivileged account {owner['name']} (uid {owner['uid']}, no login,"
            " no home): the projects root makes belong to it, and the agent runs as it"
        )
    owner = made["owner"]
    print(
        f"made {made['project']}/ (owned by {owner['name']}, uid {owner['uid']}, whom the"
        f" agent runs as) with a first task: {made['task']}"
    )
    task = shlex.quote(os.path.relpath(made["task"]))
    print(f"next: kagura-agent plan {task}   then: kagura-agent apply {task}")
    return 0


def init_project(name: str, folder: Path, *, owner: str | None = None) -> dict[str, Any]:
    """Make ``folder`` with a first task named ``name``; return what was made."""
    from kagura_agent.membrane.account import ensure_agent_account, project_owner
    from kagura_agent.membrane.roots import check_project_root

    if not NAME.fullmatch(name):
        raise UsageError(
            f"NAME {name!r}: a task name is 1-63 of a-z, 0-9 and '-', starting and ending"
            " with a letter or digit"
        )
    root = os.geteuid() == 0
    if owner is not None and not root:
        raise UsageError("--as USER needs root (a normal user's project is their own)")
    folder = folder.expanduser().absolute()
    fresh = _make_folder(folder)
    before = folder.stat()
    task = folder / TASK_FILE
    try:
        created = False
        if root:
            account, created = (project_owner(owner), False) if owner else ensure_agent_account()
            os.chown(folder, account.uid, account.gid)
            who = {"name": account.name, "uid": account.uid, "gid": account.gid}
        else:
            who = {"name": _user_name(os.geteuid()), "uid": os.geteuid(), "gid": os.getegid()}
        # The operator's file in the agent's folder (a run mounts it read-only).
        with open(task, "x", encoding="utf-8") as handle:
            handle.write(STARTER.format(name=name))
        os.chmod(task, 0o644)
        problem = check_project_root(str(folder))
        if problem:
            raise RefusedError(problem, hint="make it somewhere of your own: init NAME DIR")
    except BaseException:
        task.unlink(missing_ok=True)
        if fresh:
            folder.rmdir()
        else:  # the empty folder it was given, as it was
            os.chown(folder, before.st_uid, before.st_gid)
        raise
    return {
        "project": str(folder),
        "task": str(task),
        "owner": who,
        "account_created": created,
    }


def _make_folder(folder: Path) -> bool:
    """Make ``folder`` (True), or accept it empty (False); never touch a folder in use."""
    try:
        folder.mkdir(mode=0o755)
    except FileExistsError:
        if not folder.is_dir() or folder.is_symlink():
            raise UsageError(f"{folder} exists and is not a folder; nothing was written") from None
        if any(folder.iterdir()):
            raise UsageError(
                f"{folder} exists and is not empty; nothing was written",
                hint="name a new folder: kagura-agent init NAME DIR",
            ) from None
        return False
    except FileNotFoundError:
        raise UsageError(f"{folder.parent} does not exist; nothing was written") from None
    except OSError as exc:
        raise UsageError(f"cannot make {folder}: {exc.strerror}") from None
    folder.chmod(0o755)  # whatever the umask
    return True


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
