"""What the operator's git hooks run after a run: protected, or moved aside and said.

manifest/hooksurface.py reads the installed hooks; the plan mounts the hook managers'
existing configuration read-only; apply/aftercare/hookcheck.py moves aside, after the run, what
the run created or changed that the hooks would read or run (a module shadowing what
pre-commit's ``python -mpre_commit`` imports from the top of the work tree, a new
``lefthook-local.yml``, overcommit plugins, ``package.json``'s simple-git-hooks section, a
script a hook names) and the run's result lists it (``moved_aside``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    AGENT_UID,
    REPO,
    cli_env,
    json_lines,
    kagura,
    last_json,
    make_project,
    write_task,
)
from planting import marks_left, module_code, writing_step

from kagura_agent.apply.aftercare.hookcheck import check_hooks
from kagura_agent.manifest.hooksurface import surface

PRE_COMMIT = shutil.which("pre-commit")
needs_pre_commit = pytest.mark.skipif(
    PRE_COMMIT is None and not os.environ.get("CI"), reason="pip install pre-commit"
)
LOCAL_HOOK = """repos:
  - repo: local
    hooks:
      - id: ran
        name: ran
        entry: touch {ran}
        language: system
        always_run: true
        pass_filenames: false
"""


def _operator_env(tmp_path: Path) -> dict[str, str]:
    """The operator's git (and pre-commit's) in a root the agent's uid owns."""
    return {
        **os.environ,
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
    }


def _git(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    ident = ["-c", "user.name=o", "-c", "user.email=o@o"]
    return subprocess.run(
        ["git", "-C", str(project), *ident, *args], env=env, capture_output=True, text=True
    )


def _give_to_agent(project: Path) -> None:
    if os.geteuid() == 0:
        for path in [project, *project.rglob("*")]:
            os.lchown(path, AGENT_UID, AGENT_UID)


def _plant(marks: Path, names: list[str]) -> str:
    """A shell step writing shadowing modules at the top; each leaves marks/hook--NAME."""
    marked = {rel: module_code(str(marks / f"hook--{rel.replace('/', '.')}")) for rel in names}
    return writing_step(marked)


@needs_pre_commit
def test_modules_shadowing_pre_commit_are_moved_aside_and_the_next_commit_runs_pre_commit(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """pre-commit's hook runs ``python -mpre_commit`` from the top of the work tree: a
    ``pre_commit/`` package (or ``json.py``, ``yaml.py``, ``cfgv.py``: what it imports) the
    run wrote there would run on the operator's next commit."""
    project = make_project(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    ran = tmp_path / "hook-ran"
    env = _operator_env(tmp_path)
    assert _git(project, env, "init", "-q").returncode == 0
    (project / ".pre-commit-config.yaml").write_text(LOCAL_HOOK.format(ran=ran))
    subprocess.run(
        [PRE_COMMIT or "pre-commit", "install"],
        cwd=project,
        env=env,
        check=True,
        capture_output=True,
    )
    (project / "README").write_text("a project\n")
    assert _git(project, env, "add", "-A").returncode == 0
    assert _git(project, env, "commit", "-qm", "start").returncode == 0
    ran.unlink()
    _give_to_agent(project)
    shadows = ["pre_commit/__init__.py", "pre_commit/__main__.py", "json.py", "yaml.py", "cfgv.py"]
    steps = [_plant(marks, shadows), "echo 'VALUE = 1' > myproject.py", "mkdir -p build"]
    task = write_task(project, "shadow", {"steps": steps, "verify": ["test -s myproject.py"]})
    done = kagura(["apply", "--yes", "--json", str(task)], cli_env(state_dir))

    # The operator's next commit, with the real git and the real pre-commit.
    assert _git(project, env, "add", "-A").returncode == 0
    committed = _git(project, env, "commit", "-qm", "after the run")
    assert marks_left(marks) == []
    assert committed.returncode == 0, committed.stdout + committed.stderr
    assert ran.exists()  # the operator's own hook ran, through the real pre-commit

    assert done.returncode == 0, done.stderr[-4000:]
    result = last_json(done.stdout)
    moved = {item["path"]: item for item in result["moved_aside"]}
    assert sorted(moved) == ["cfgv.py", "json.py", "pre_commit", "yaml.py"]
    assert moved["pre_commit"]["to"] == "pre_commit.kagura-refused-1"
    assert "imported by the hooks' python -m" in moved["json.py"]["why"]
    assert (project / "json.py.kagura-refused-1").is_file()  # moved, never deleted
    assert (project / "myproject.py").is_file() and (project / "build").is_dir()  # the project's
    notes = [e["message"] for e in json_lines(done.stderr) if e.get("kind") == "note"]
    assert any(n.startswith("moved aside pre_commit -> pre_commit.kagura-refused-1") for n in notes)
    shown = _docs_json("moved_aside")
    assert shown == [moved[p] for p in ("pre_commit", "json.py")]


HOOKS = {
    # What each manager's installer writes into .git/hooks, reduced to what identifies it.
    "pre-commit": (
        '#!/bin/sh\ncall_lefthook()\n{\n  dir="$(git rev-parse --show-toplevel)"\n'
        "  if lefthook -h >/dev/null 2>&1; then eval lefthook $@\n"
        '  elif test -f "$dir/node_modules/lefthook/bin/index.js"; then\n'
        '    eval "\\"$dir/node_modules/lefthook/bin/index.js\\" $@"\n  fi\n}\n'
        'call_lefthook "run pre-commit $@"\n'
    ),
    "commit-msg": "#!/usr/bin/env ruby\n# Entrypoint for Overcommit hook integration.\nexit 0\n",
    "pre-push": (
        '#!/bin/sh\n\nif [ "$SKIP_SIMPLE_GIT_HOOKS" = "1" ]; then\n    exit 0\nfi\n\n'
        "./scripts/check.sh\n"
    ),
}
AGENT_WRITES = [
    "printf 'pre-commit:\\n  commands:\\n    x:\\n      run: touch /tmp/x\\n' > lefthook-local.yml",
    "mkdir -p .lefthook/pre-commit && echo 'touch /tmp/x' > .lefthook/pre-commit/x.sh",
    "mkdir -p .git-hooks/pre_commit && echo 'system(\"touch /tmp/x\")' > .git-hooks/pre_commit/x.rb",
    "mkdir -p node_modules/lefthook/bin && echo 'require(\"fs\")' > node_modules/lefthook/bin/index.js",
    "sed -i 's#./scripts/check.sh#touch /tmp/x#' package.json",
    "echo 'touch /tmp/x' >> scripts/check.sh",
    "echo 'touch /tmp/x' >> tools/post-checkout",
]


def test_lefthook_overcommit_simple_git_hooks_and_named_scripts(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    project = make_project(tmp_path)
    env = _operator_env(tmp_path)
    assert _git(project, env, "init", "-q").returncode == 0
    hooks = project / ".git" / "hooks"
    for name, text in HOOKS.items():
        (hooks / name).write_text(text)
        (hooks / name).chmod(0o755)
    (project / "tools").mkdir()
    (project / "tools" / "post-checkout").write_text("#!/bin/sh\nexit 0\n")
    (hooks / "post-checkout").symlink_to(project / "tools" / "post-checkout")
    (project / "scripts").mkdir()
    (project / "scripts" / "check.sh").write_text("#!/bin/sh\nexit 0\n")
    (project / "lefthook.yml").write_text("pre-commit:\n  commands: {}\n")
    (project / ".overcommit.yml").write_text("PreCommit: {}\n")
    package = {
        "name": "p",
        "version": "1.0.0",
        "simple-git-hooks": {"pre-push": "./scripts/check.sh"},
    }
    (project / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    _give_to_agent(project)
    attempts = {
        "lefthook-edit": "echo 'x: 1' >> lefthook.yml",
        "overcommit-edit": "echo 'x: 1' >> .overcommit.yml",
        "lefthook-swap": "mv lefthook.yml old.yml",
    }
    tries = [
        f"if {cmd}; then echo {name}=W$((0)); else echo {name}=R$((0)); fi"
        for name, cmd in attempts.items()
    ]
    task = write_task(project, "managers", {"steps": [*tries, *AGENT_WRITES], "verify": ["true"]})
    done = kagura(["apply", "--yes", "--json", str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr[-4000:]
    for name in attempts:  # protected for the run: read-only mounts
        assert f"{name}=R0" in done.stderr and f"{name}=W0" not in done.stderr, name
    assert (project / "lefthook.yml").read_text() == "pre-commit:\n  commands: {}\n"
    assert (project / ".overcommit.yml").read_text() == "PreCommit: {}\n"
    moved = {item["path"]: item["to"] for item in last_json(done.stdout)["moved_aside"]}
    assert moved == {
        "lefthook-local.yml": "lefthook-local.yml.kagura-refused-1",
        ".lefthook": ".lefthook.kagura-refused-1",
        ".git-hooks": ".git-hooks.kagura-refused-1",
        "node_modules/lefthook": "node_modules/lefthook.kagura-refused-1",
        "package.json": "package.json.kagura-refused-1",
        "scripts/check.sh": "scripts/check.sh.kagura-refused-1",
        "tools/post-checkout": "tools/post-checkout.kagura-refused-1",
    }
    assert not (project / "package.json").exists()
    assert "touch /tmp/x" in (project / "package.json.kagura-refused-1").read_text()

    # A run that only works in the project (package.json's other keys, new scripts) keeps
    # everything where it is.
    (project / "package.json.kagura-refused-1").rename(project / "package.json")
    (project / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    os.chown(project / "package.json", AGENT_UID, AGENT_UID)
    work = [
        "sed -i 's/1.0.0/1.0.1/' package.json",
        "echo 'echo hi' > scripts/other.sh",
        "mkdir -p src && echo 'x = 1' > src/app.py",
    ]
    task = write_task(
        project, "managers", {"steps": work, "verify": ["grep -q 1.0.1 package.json"]}
    )
    again = kagura(["apply", "--yes", "--json", str(task)], cli_env(state_dir))
    assert again.returncode == 0, again.stderr[-4000:]
    assert last_json(again.stdout)["moved_aside"] == []


@needs_pre_commit
def test_the_surface_of_a_real_pre_commit_install(tmp_path: Path) -> None:
    env = _operator_env(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True, env=env)
    repo = tmp_path / "repo"
    (repo / ".pre-commit-config.yaml").write_text("repos: []\n")
    subprocess.run([PRE_COMMIT or "pre-commit", "install"], cwd=repo, env=env, check=True,
                   capture_output=True)  # fmt: skip
    found = surface(str(repo), str(repo / ".git" / "hooks"))
    assert found.managers == ("pre-commit",)
    assert found.modules == ("pre_commit",)
    assert len(found.pythons) == 1 and os.path.isabs(found.pythons[0])
    [config] = found.watched
    assert (config.rel, config.protect) == (".pre-commit-config.yaml", "always")


def test_a_root_without_git_or_hooks_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text("x = 1\n")
    assert check_hooks(str(tmp_path), 0.0).moved == ()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert check_hooks(str(tmp_path), 0.0).moved == ()  # no hook installed


def _docs_json(key: str) -> Any:
    """The JSON example of docs/membrane.md's hook section (its ``key``)."""
    text = (REPO / "docs" / "membrane.md").read_text(encoding="utf-8")
    section = text.split("## What the operator's git hooks run", 1)[1].split("\n## ", 1)[0]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]
    return json.loads(block)[key]


def test_after_kill_9_the_sweep_checks_by_ctime_alone(tmp_path: Path) -> None:
    """The dead run's snapshot died with it: a changed package.json that a hook manager
    reads commands from is taken for the run's; names are withheld."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git" / "hooks" / "pre-push").write_text(HOOKS["pre-push"])
    package = {"name": "p", "simple-git-hooks": {"pre-push": "true"}}
    (repo / "package.json").write_text(json.dumps(package))
    report = check_hooks(str(repo), 0.0)
    assert [(rel, to) for rel, to, _ in report.moved] == [
        ("package.json", "package.json.kagura-refused-1")
    ]
    [line] = report.summary(withhold_names=True)
    assert "package.json" not in line and "names withheld" in line
