"""The agent's repository in its container: seeded before the agent runs, read after.

Every command here is the image's git, run through ``docker exec`` in the agent's
container as the agent's user (the container's own processes, in its sandbox: no network
but the proxy, no credentials of the host's), with no system or global configuration and
no hooks, fsmonitor or replace refs of the repository's. The seed runs before the agent
has run, on the operator's objects (mounted read-only) and an empty tmpfs; the listing
and the bundle run after, on whatever the agent left: its hooks, config, alternates or
symlinks act inside its own container only, and what comes out is checked by the host as
hostile bytes (agentgit/importer.py).
"""

from __future__ import annotations

import re

from kagura_agent.membrane.floor import AGENT_GIT, OPERATOR_GIT

# Who the agent's commits are by, unless it says otherwise (its repository's config).
AUTHOR = "kagura-agent"
AUTHOR_EMAIL = "agent@kagura.invalid"
SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
BRANCH = re.compile(r"^kagura/[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")
# Bounded inside the container: the agent's repository may make git slow on purpose.
EXPORT_SECONDS = 120

# The environment of every git below: nothing of the system's, the agent's home or its
# repository's replace refs; GIT_DIR named (no discovery from a working directory).
_ENV = (
    f"export GIT_DIR={AGENT_GIT} GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null"
    " HOME=/nonexistent GIT_NO_REPLACE_OBJECTS=1 GIT_TERMINAL_PROMPT=0 LC_ALL=C;"
)
_OFF = "-c core.hooksPath=/dev/null -c core.fsmonitor=false"


def seed_argv(seed: str, branch: str, object_format: str) -> list[str]:
    """Make the agent's repository at /workspace/.git: no template (no hooks), the
    operator's objects as alternates, ``branch`` at ``seed`` and HEAD on it, the index
    read from the seed (the work tree is the project root as it is)."""
    _check(seed, branch)
    if object_format not in ("sha1", "sha256"):
        raise ValueError(f"unknown object format {object_format!r}")
    script = (
        "set -eu; "
        + _ENV
        + f" git {_OFF} init -q --template= --object-format={object_format} {AGENT_GIT};"
        + f" git {_OFF} config core.bare false;"
        + f" mkdir -p {AGENT_GIT}/objects/info;"
        + f" printf '%s\\n' {OPERATOR_GIT}/objects > {AGENT_GIT}/objects/info/alternates;"
        + f" git {_OFF} config user.name {AUTHOR};"
        + f" git {_OFF} config user.email {AUTHOR_EMAIL};"
        + f" git {_OFF} update-ref refs/heads/{branch} {seed};"
        + f" git {_OFF} symbolic-ref HEAD refs/heads/{branch};"
        + f" git {_OFF} --work-tree=/workspace reset -q --mixed {seed}"
    )
    return ["sh", "-c", script]


def refs_argv() -> list[str]:
    """Every ref of the agent's repository (loose and packed): ``SHA REFNAME`` lines."""
    script = (
        _ENV
        + f" exec timeout {EXPORT_SECONDS} git {_OFF} for-each-ref"
        + " '--format=%(objectname) %(refname)'"
    )
    return ["sh", "-c", script]


def bundle_argv(seed: str, branch: str) -> list[str]:
    """A git bundle of ``branch`` without what the seed has, on standard output."""
    _check(seed, branch)
    script = (
        _ENV
        + f" exec timeout {EXPORT_SECONDS} git {_OFF} bundle create -q -"
        + f" refs/heads/{branch} --not {seed}"
    )
    return ["sh", "-c", script]


def _check(seed: str, branch: str) -> None:
    """Both go into a shell command line: only what the planner could have made."""
    if not SHA.match(seed):
        raise ValueError(f"not a commit id: {seed!r}")
    if not BRANCH.match(branch) or ".." in branch or branch.endswith(".lock"):
        raise ValueError(f"not a branch kagura makes: {branch!r}")
