"""Host inputs that do not exist yet, held empty and read-only for the run.

The planner protects ``.git`` and ``./manifests`` at the top of the project root even
when they are absent (``manifest/task.py`` ``protected_inputs``): what the agent created
there, the host would trust next time (the operator's next git command runs its hooks
and config; the next plan reads ``./manifests`` as the operator's folder). A bind mount
needs a source, so each one becomes an empty folder before a container mounts it
(``create_missing``, called by the runtime's ``create``), and apply removes them after
its last container (``held_absent``); the plan's read-only mount over it means the agent
can neither write in it nor remove or rename it. A ``kill -9`` in between leaves the
empty folder, which the next plan protects like any existing input.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from kagura_agent.errors import RefusedError
from kagura_agent.inputfile import empty_folder
from kagura_agent.plan.model import Plan


def placeholders(plan: Plan) -> list[str]:
    """The sources of the plan's placeholder mounts."""
    return [
        m["source"] for m in plan["mounts"] if m["kind"] == "protected" and m.get("placeholder")
    ]


def create_missing(plan: Plan) -> list[str]:
    """Make each missing placeholder source an empty folder; return those made.

    An ordinary folder (0755 before the umask): the read-only mount is what protects
    it inside the container, and one a ``kill -9`` leaves behind is an ordinary folder
    for the operator's own ``git init``.
    """
    made = []
    for source in placeholders(plan):
        try:
            os.mkdir(source, 0o755)  # never follows a planted symlink
        except FileExistsError:
            continue  # an empty folder (held_absent checked it): held, left as it was
        except OSError as exc:
            # Unprotected, the agent could create it: no run.
            raise RefusedError(
                f"cannot hold {source} for the run: {exc.strerror}",
                hint="create it yourself, or let agents write it (writable_git: true, or"
                " an operator manifest folder named with --manifests)",
            ) from None
        made.append(source)
    return made


@contextlib.contextmanager
def held_absent(plan: Plan) -> Iterator[list[str]]:
    """Create every placeholder for the run; remove those it made (when still empty) on
    exit. One that exists as an empty folder is held as it is (the planner treats an empty
    folder as absent: another run of the root may hold it while this plan was made).

    RefusedError when one exists with something in it (or as a link or a file): it
    appeared after the plan was made, and the plan did not look at what it holds.
    """
    for source in placeholders(plan):
        if os.path.lexists(source) and not empty_folder(source):
            raise RefusedError(
                f"{source} appeared in the project root after the plan was made",
                hint="plan again: the plan must see what it holds",
            )
    made: list[str] = []
    try:
        made = create_missing(plan)
        yield made
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):  # not empty: the operator put something there
                os.rmdir(path)
