"""The agent's commits come back as a branch (``spec.commits: branch``), and nothing else
of its repository does, through ``kagura-agent apply`` in real containers.

The script brain's steps are the agent: from inside its container it commits in the
repository it was given (seeded from the operator's HEAD, a tmpfs at /workspace/.git), and
crafts it the way an attacker would — hooks, config naming commands (core.fsmonitor,
core.hooksPath, include and includeIf, uploadpack.packObjectsHook), packed refs, tags,
other branches, notes and replace refs, alternates, symlinks inside .git and in commits,
huge objects, a rewrite of the seeded history, a merge of other history, a submodule. Each
command it plants would touch a canary file in the host's /tmp if it ever ran on the host
(in its container /tmp is a tmpfs of its own). After every run: no canary; the operator's
refs are what they were, but for the one new branch where plain commits came back; the
operator's hooks and config untouched. The operator's repository has a hook and an
fsmonitor of its own that the import must not run either.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import AGENT_UID, cli_env, kagura, last_json, make_project, write_task

pytestmark = pytest.mark.docker

COMMIT = "echo change >> README && git add README && git commit -q -m 'agent change'"


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-C", str(root), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _operator_repo(tmp_path: Path, canary: Path) -> Path:
    """The operator's project: two commits, a reference-transaction hook and an fsmonitor
    of the operator's own (the import runs neither), all owned by the agent's uid."""
    root = make_project(tmp_path)
    ident = ["-c", "user.email=op@example.invalid", "-c", "user.name=op"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    (root / "README").write_text("one\n")
    _git(root, "add", "README")
    _git(root, *ident, "commit", "-q", "-m", "one")
    (root / "README").write_text("one\ntwo\n")
    _git(root, *ident, "commit", "-q", "-am", "two")
    hook = root / ".git" / "hooks" / "reference-transaction"
    hook.write_text(f"#!/bin/sh\ntouch {canary}.operator-hook\n")
    hook.chmod(0o755)
    _git(root, "config", "core.fsmonitor", f"touch {canary}.operator-fsmonitor")
    if os.geteuid() == 0:
        for path in [root, *root.rglob("*")]:
            os.lchown(path, AGENT_UID, AGENT_UID)
    return root


def _state(root: Path) -> dict[str, Any]:
    """The operator's refs, hooks and config."""
    hooks = root / ".git" / "hooks"
    return {
        "refs": _git(root, "for-each-ref", "--format=%(objectname) %(refname)"),
        "hooks": sorted((p.name, p.read_bytes()) for p in hooks.iterdir()),
        "config": (root / ".git" / "config").read_bytes(),
        "packed": (root / ".git" / "packed-refs").read_bytes()
        if (root / ".git" / "packed-refs").exists()
        else b"",
    }


def _run(
    tmp_path: Path, state_dir: Path, steps: list[str], *, verify: bool = False
) -> tuple[dict[str, Any], Path, str]:
    canary = Path("/tmp") / f"kagura-hostile-{uuid.uuid4().hex[:12]}"
    root = _operator_repo(tmp_path, canary)
    before = _state(root)
    seed = _git(root, "rev-parse", "HEAD").strip()
    task = write_task(
        root,
        "branchy",
        {
            "brain": "script",
            "steps": [step.replace("CANARY", str(canary)) for step in steps],
            "commits": "branch",
            # Verify sees the operator's repository, read-only, where git looks for it.
            **({"verify": [f'test "$(git rev-parse HEAD)" = {seed}']} if verify else {}),
        },
    )
    # The task file is the operator's, not part of the repository's history.
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("task.yml\n")
    before = _state(root)
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", "--json", str(task)], env, timeout=600)
    result = last_json(done.stdout)
    assert "commits" in result, done.stdout + done.stderr
    if verify:
        assert [v["exit_code"] for v in result["verify"]] == [0], done.stdout
    commits = result["commits"]
    commits["_output"] = done.stdout + done.stderr
    after = _state(root)
    # Nothing the agent planted ran on the host, nor did the operator's own hook.
    assert not list(Path("/tmp").glob(canary.name + "*")), "a planted command ran on the host"
    assert after["hooks"] == before["hooks"] and after["config"] == before["config"]
    new_refs = set(after["refs"].splitlines()) - set(before["refs"].splitlines())
    gone = set(before["refs"].splitlines()) - set(after["refs"].splitlines())
    assert not gone, gone
    branch = commits["branch"]
    if commits["status"] == "imported":
        assert new_refs == {f"{commits['tip']} refs/heads/{branch}"}, new_refs
        # Plain commits on top of the seed.
        assert _git(root, "merge-base", "--is-ancestor", seed, branch) == ""
    else:
        assert new_refs == set(), new_refs
    assert not [r for r in after["refs"].splitlines() if "refs/tags/" in r]
    return commits, root, seed


def test_plain_commits_come_back_as_a_branch_with_the_operators_hooks_off(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    commits, root, seed = _run(
        tmp_path,
        state_dir,
        [
            # Its repository is its own: a branch named for the run, at the operator's HEAD,
            # no hook of the operator's.
            "git branch --show-current | grep -q '^kagura/branchy/run-'",
            'test -z "$(ls .git/hooks 2>/dev/null)" && git status --short',
            COMMIT,
            "echo file > new.txt && git add new.txt && git commit -q -m 'agent adds a file'",
        ],
        verify=True,
    )
    assert (commits["status"], commits["commits"]) == ("imported", 2), commits
    log = _git(root, "log", "--format=%an %s", f"{seed}..{commits['branch']}")
    assert log.splitlines() == ["kagura-agent agent adds a file", "kagura-agent agent change"]
    assert _git(root, "rev-parse", "HEAD").strip() == seed  # the operator's HEAD stays
    assert commits["other_refs"] == 0


HOSTILE_BUT_PLAIN = [
    COMMIT,
    # Hooks in its .git and in a hooks folder its config names; config naming commands.
    "mkdir -p .git/hooks && for h in post-commit reference-transaction pre-auto-gc post-checkout post-merge"
    " post-rewrite pre-push; do printf '#!/bin/sh\\ntouch CANARY.hook\\n' > .git/hooks/$h;"
    " chmod +x .git/hooks/$h; done",
    "mkdir -p evilhooks && cp .git/hooks/* evilhooks/ && git config core.hooksPath /workspace/evilhooks",
    "git config core.fsmonitor 'touch CANARY.fsmonitor' && git config uploadpack.packObjectsHook"
    " 'touch CANARY.packhook' && git config core.sshCommand 'touch CANARY.ssh'"
    " && git config core.alternateRefsCommand 'touch CANARY.altrefs'",
    "printf '[core]\\n\\tfsmonitor = touch CANARY.include\\n' > evil.cfg"
    " && git config include.path /workspace/evil.cfg"
    " && git config 'includeIf.gitdir:/.path' /workspace/evil.cfg",
    # Refs outside its branch, packed.
    "git tag v-agent && git tag -a v-annotated -m tag && git branch side"
    " && git notes add -m note HEAD && git replace -f HEAD HEAD~1 && git pack-refs --all",
]


def test_hooks_config_and_refs_outside_the_branch_stay_in_the_container(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    commits, root, _ = _run(tmp_path, state_dir, HOSTILE_BUT_PLAIN)
    assert (commits["status"], commits["commits"]) == ("imported", 1), commits
    assert commits["other_refs"] >= 5, commits[
        "_output"
    ]  # two tags, a branch, notes, a replace ref
    # Its replace ref did not come along: the commit is the agent's own, not its parent.
    assert _git(root, "log", "-1", "--format=%s", commits["branch"]).strip() == "agent change"


@pytest.mark.parametrize(
    ("steps", "why"),
    [
        pytest.param(
            ["git commit -q --amend -m 'the seed, rewritten'"],
            "rewrote the seeded history",
            id="rewrite",
        ),
        pytest.param(
            [
                COMMIT,
                "git update-ref HEAD $(git commit-tree -p HEAD -p HEAD~2 -m merge HEAD^{tree})",
            ],
            "neither the seed nor one of the agent's commits",
            id="merge-of-other-history",
        ),
        pytest.param(
            [
                "git update-index --add --cacheinfo 160000,$(git rev-parse HEAD),sub",
                "printf '[submodule \"sub\"]\\n\\tpath = sub\\n\\turl = ext::sh -c touch%% CANARY.sub\\n'"
                " > .gitmodules && git add .gitmodules && git commit -q -m submodule",
            ],
            ".gitmodules",
            id="submodule",
        ),
        pytest.param(
            ["ln -s /etc/passwd .gitattributes && git add .gitattributes && git commit -q -m l"],
            "gitattributesSymlink",
            id="symlinked-gitattributes",
        ),
        pytest.param(
            ["head -c 60000000 /dev/zero > big && git add big && git commit -q -m big"],
            "an object of",
            id="huge-object",
        ),
        pytest.param(
            ["head -c 110000000 /dev/urandom > big && git add big && git commit -q -m big"],
            "weigh more than 100 MiB",
            id="heavy-branch",
        ),
        pytest.param(
            [
                COMMIT,
                "git checkout -q -b elsewhere && git branch -D $(git for-each-ref"
                " --format='%(refname:short)' refs/heads/kagura)",
            ],
            "has no branch",
            id="branch-deleted",
        ),
        pytest.param(
            [
                COMMIT,
                "rm -f .git/packed-refs && ln -s /etc/shadow .git/packed-refs"
                " && rm -rf .git/refs/tags && ln -s /kagura/operator.git/refs .git/refs/tags"
                " && echo /etc > .git/objects/info/alternates",
            ],
            "could not be listed",
            id="symlinks-in-git",
        ),
    ],
)
def test_anything_but_plain_commits_on_the_seed_is_refused(
    docker_client: Any, tmp_path: Path, state_dir: Path, steps: list[str], why: str
) -> None:
    commits, _, _ = _run(tmp_path, state_dir, steps)
    if why:
        assert commits["status"] == "refused" and why in commits["why"], commits["_output"]
    # Whatever it was, the operator's repository holds no more than the one branch (the
    # checks in _run) and no name the agent chose reached the result.
    assert "CANARY" not in json.dumps({k: v for k, v in commits.items() if k != "_output"})


def test_objects_it_keeps_elsewhere_come_in_whole_or_not_at_all(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """Its commit's objects moved out of .git into the project root, borrowed back through
    alternates: the host never follows its alternates; what comes in is the bundle's, so
    the branch holds every object once the project root's copy is gone."""
    move = (
        "mkdir -p stash && for d in .git/objects/[0-9a-f][0-9a-f]; do mkdir -p stash/${d##*/}"
        " && mv $d/* stash/${d##*/}/ && rmdir $d; done"
        " && echo /workspace/stash >> .git/objects/info/alternates && git log -1 --format=%s"
    )
    commits, root, seed = _run(tmp_path, state_dir, [COMMIT, move])
    assert commits["status"] == "imported", commits["_output"]
    subprocess.run(["rm", "-rf", str(root / "stash")], check=True)
    listed = _git(root, "rev-list", "--objects", "--missing=print", commits["branch"], f"^{seed}")
    assert listed and not [line for line in listed.splitlines() if line.startswith("?")]
