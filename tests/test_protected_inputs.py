"""The agent cannot rewrite what grants it: host inputs inside the project root are read-only.

A task file or a manifest folder inside the project root (the usual layout: task.yml and
manifests/ at the top of a repository) would let the agent grant itself capabilities for
the next run — a baseline EgressPolicy, a graduation baseline, a new step. The planner
mounts each one's top-level entry read-only over the root, and refuses a root that lies
inside such an input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import AGENT_UID, cli_env, kagura, make_project, write_task

from kagura_agent.cli.main import main
from kagura_agent.errors import RefusedError
from kagura_agent.manifest.task import protected_inputs
from kagura_agent.membrane.placeholders import create_missing, held_absent

REPO = Path(__file__).resolve().parents[1]
FACTS = {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {}}


def _plan(project: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    facts = project.parent / "facts.json"
    facts.write_text(json.dumps(FACTS), encoding="utf-8")
    assert main(["plan", "--json", "--facts", str(facts), *argv]) == 0, capsys.readouterr().err
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    return plan


@pytest.mark.usefixtures("without_docker")
def test_a_task_file_and_manifest_folder_in_the_root_are_mounted_read_only(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = make_project(tmp_path)
    shutil.copytree(REPO / "manifests", project / "manifests")
    task = write_task(project, "layout", {"steps": ["ls"]})
    plan = _plan(project, capsys, "--manifests", str(project / "manifests"), str(task))
    protected = [
        (m["source"], m["target"], m["mode"], m["protects"])
        for m in plan["mounts"]
        if m["kind"] == "protected"
    ]
    root = os.path.realpath(project)
    git = "git metadata (hooks and config run on the operator's next git command)"
    assert protected == [
        (f"{root}/.git", "/workspace/.git", "ro", git),  # absent: held empty for the run
        (f"{root}/manifests", "/workspace/manifests", "ro", "the operator manifest folder"),
        (f"{root}/task.yml", "/workspace/task.yml", "ro", "this task file"),
    ]
    # Not a capability: nothing to approve, nothing to graduate.
    assert all(not a["category"].startswith("mount:") for a in plan["approvals"])
    assert plan["applyable"] is True
    assert main(["plan", "--manifests", str(project / "manifests"), str(task)]) == 0
    assert "protected    " + f"{root}/task.yml -> /workspace/task.yml" in capsys.readouterr().out


def test_a_nested_input_protects_its_top_level_entry(tmp_path: Path) -> None:
    root = str(tmp_path)
    (tmp_path / "config" / "kagura").mkdir(parents=True)
    mounts, problem = protected_inputs(
        root, [(f"{root}/config/kagura", "the operator manifest folder"), ("/elsewhere", "x")]
    )
    assert problem is None
    assert [(m["source"], m["target"]) for m in mounts] == [(f"{root}/config", "/workspace/config")]


def test_a_root_inside_the_manifest_folder_is_refused(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = tmp_path / "ops"
    shutil.copytree(REPO / "manifests", ops)
    (ops / "work").mkdir()
    task = tmp_path / "task.yml"
    task.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: t}\n"
        "spec:\n  project_root: ops/work\n  steps: [ls]\n",
        encoding="utf-8",
    )
    assert main(["validate", "--manifests", str(ops), str(task)]) == 2
    err = capsys.readouterr().err
    assert "task.yml:" in err and "$.spec.project_root" in err
    assert "is inside the operator manifest folder" in err


def test_the_agent_cannot_write_rename_or_remove_them(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    """From inside a real container: every write to the protected inputs fails."""
    project = make_project(tmp_path)
    shutil.copytree(REPO / "manifests", project / "manifests")
    (project / ".git" / "hooks").mkdir(parents=True)
    (project / ".git" / "config").write_text("[core]\n\tbare = false\n")
    if os.geteuid() == 0:
        for path in [*project.rglob("*")]:
            os.chown(path, AGENT_UID, AGENT_UID)
    attempts = {
        "add": "echo evil > manifests/zz-evil.yml",
        "edit": "echo '# evil' >> manifests/egress.yml",
        "rename": "mv manifests manifests.old",
        "remove": "rm -rf manifests",
        "task-append": "echo '# evil' >> task.yml",
        "task-move": "mv task.yml task.old",
        "task-remove": "rm -f task.yml",
        "git-hook": "echo 'touch /tmp/owned' > .git/hooks/post-checkout",
        "git-config": "printf '[core]\\n\\tfsmonitor = evil\\n' >> .git/config",
        "git-rename": "mv .git .git2",
    }
    steps = [
        f"if {cmd}; then echo {name}=W$((0)); else echo {name}=R$((0)); fi"
        for name, cmd in attempts.items()
    ]
    steps.append("echo fine > notes.txt")  # the rest of the root stays writable
    task = write_task(project, "protected", {"steps": steps})
    before = {
        p: p.read_bytes()
        for p in [task, project / ".git" / "config", *(project / "manifests").iterdir()]
    }
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", "--manifests", str(project / "manifests"), str(task)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout + done.stderr  # the live view of the steps' output
    for name in attempts:
        # Markers computed by the shell, so the echoed command line never matches.
        assert f"{name}=R0" in shown and f"{name}=W0" not in shown, (name, shown[-3000:])
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in (project / "manifests").iterdir()) == sorted(
        p.name for p in before if p.parent.name == "manifests"
    )
    assert list((project / ".git" / "hooks").iterdir()) == []
    assert (project / "notes.txt").read_text() == "fine\n"


def test_git_metadata_is_read_only_unless_the_operator_allows_it(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = make_project(tmp_path)
    (project / ".git").mkdir()
    task = write_task(project, "git", {"steps": ["ls"]})

    def protected(*argv: str) -> list[str]:
        plan = _plan(project, capsys, *argv, str(task))
        return [m["target"] for m in plan["mounts"] if m["kind"] == "protected"]

    # No operator folder: ./manifests at the root is where the next run would look.
    assert protected() == ["/workspace/.git", "/workspace/manifests", "/workspace/task.yml"]
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "git.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: agents-commit}\n"
        "spec:\n  writable_git: true\n  rules: []\n",
        encoding="utf-8",
    )
    assert protected("--manifests", str(ops)) == ["/workspace/task.yml"]


@pytest.mark.usefixtures("without_docker")
def test_inputs_that_do_not_exist_yet_are_protected_as_placeholders(
    tmp_path: Path,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run from the project root with no operator folder (``run "TEXT"`` in a project):
    the next invocation reads ``./manifests`` as the operator's folder, and the operator's
    next ``git status`` there reads ``.git``. Neither exists yet; both are protected."""
    project = make_project(tmp_path)
    task = write_task(project, "fresh", {"steps": ["ls"]})
    monkeypatch.chdir(project)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    root = os.path.realpath(project)
    plan = _plan(project, capsys, str(task))
    held = [
        (m["source"], m["target"], m.get("placeholder"))
        for m in plan["mounts"]
        if m["kind"] == "protected"
    ]
    assert held == [
        (f"{root}/.git", "/workspace/.git", True),
        (f"{root}/manifests", "/workspace/manifests", True),
        (f"{root}/task.yml", "/workspace/task.yml", None),
    ]
    assert plan["applyable"] is True
    assert main(["plan", str(task)]) == 0
    assert (
        f"protected    {root}/manifests -> /workspace/manifests (read-only over the project"
        " root, held empty while absent: the operator manifest folder ./manifests"
    ) in capsys.readouterr().out
    # With an operator folder of its own (elsewhere), ./manifests is not where it looks.
    ops = tmp_path / "ops"
    shutil.copytree(REPO / "manifests", ops)
    plan = _plan(project, capsys, "--manifests", str(ops), str(task))
    assert [m["target"] for m in plan["mounts"] if m["kind"] == "protected"] == [
        "/workspace/.git",
        "/workspace/task.yml",
    ]


def test_the_agent_cannot_create_what_the_host_would_trust_next(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    """From inside a real container, the operator's usual layout minus the folders it has
    not made yet: the agent plants ``manifests/`` (a baseline egress policy the next run
    from here would read as the operator's) and a ``.git`` (a hook, or a ``gitdir:`` file).
    Every attempt fails, and nothing of the placeholders is left after the run."""
    project = make_project(tmp_path)
    grant = (
        "apiVersion: kagura.dev/v1\\nkind: Graduation\\nmetadata: {name: mine}\\n"
        "spec: {baseline: [egress:github]}\\n"
    )
    attempts = {
        "manifests": f"mkdir -p manifests && printf '{grant}' > manifests/grant.yml",
        "manifests-move": "mkdir ../m 2>/dev/null; mv manifests manifests.old",
        "git-hooks": "mkdir -p .git/hooks && echo 'touch /tmp/owned' > .git/hooks/post-checkout",
        "git-file": "rmdir .git && echo 'gitdir: /workspace/evil' > .git",
    }
    steps = [
        f"if {cmd}; then echo {name}=W$((0)); else echo {name}=R$((0)); fi"
        for name, cmd in attempts.items()
    ]
    steps.append("echo fine > notes.txt")
    task = write_task(project, "plant", {"steps": steps})
    env = cli_env(state_dir)
    env.pop("KAGURA_AGENT_MANIFESTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "kagura_agent", "apply", "--yes", str(task)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout + done.stderr
    for name in attempts:
        assert f"{name}=R0" in shown and f"{name}=W0" not in shown, (name, shown[-3000:])
    assert sorted(p.name for p in project.iterdir()) == ["notes.txt", "task.yml"]


def test_a_plan_made_while_another_run_holds_the_placeholders_is_the_same_plan(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of the root holds .git and ./manifests as empty folders while it runs; a plan
    of the same root made meanwhile (serve compiles each launch at once, and a queued
    session applies after that run) is the plan made before or after it — not one called
    stale ('differs in mounts') when it applies."""
    project = make_project(tmp_path)
    task = write_task(project, "fresh", {"steps": ["ls"]})
    before = _plan(project, capsys, str(task))
    with held_absent(before) as made:
        assert len(made) == 2
        during = _plan(project, capsys, str(task))
    after = _plan(project, capsys, str(task))
    assert during["mounts"] == before["mounts"] == after["mounts"]
    assert during["intent"] == before["intent"]


def test_a_placeholder_that_cannot_be_made_refuses_the_run(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = make_project(tmp_path)
    task = write_task(project, "fresh", {"steps": ["ls"]})
    plan = _plan(project, capsys, str(task))
    (project / ".git").mkdir()  # appeared after the plan, with something in it
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    with (
        pytest.raises(RefusedError, match="appeared in the project root after the plan"),
        held_absent(plan),
    ):
        pass
    (project / ".git" / "HEAD").unlink()
    # Empty, it holds nothing the plan did not see: held as it is, and left as it was.
    with held_absent(plan) as made:
        assert made == [os.path.realpath(project / "manifests")]
    assert sorted(p.name for p in project.iterdir()) == [".git", "task.yml"]
    (project / ".git").rmdir()
    with held_absent(plan) as made:
        root = os.path.realpath(project)
        assert made == [f"{root}/.git", f"{root}/manifests"]
        assert (project / ".git").is_dir() and (project / "manifests").is_dir()
    assert sorted(p.name for p in project.iterdir()) == ["task.yml"]
    moved = json.loads(json.dumps(plan))
    for mount in moved["mounts"]:
        if mount.get("placeholder"):
            mount["source"] = str(tmp_path / "missing" / "deeper")
    with pytest.raises(RefusedError, match="cannot hold"):
        create_missing(moved)


def test_a_hooks_folder_in_the_work_tree_is_read_only_too(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str], docker_client: Any
) -> None:
    """husky and its kin point ``core.hooksPath`` at a folder of the work tree (``.husky``):
    the hooks there run on the operator's next commit exactly as ``.git/hooks`` would. From
    inside a real container the agent cannot add or change one."""
    project = make_project(tmp_path)
    git = ["git", "-c", "safe.directory=*", "-C", str(project)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "config", "core.hooksPath", ".husky"], check=True)
    (project / ".husky").mkdir()
    (project / ".husky" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    if os.geteuid() == 0:
        for path in [*project.rglob("*")]:
            os.chown(path, AGENT_UID, AGENT_UID)
    attempts = {
        "hook-edit": "echo 'touch /tmp/owned' >> .husky/pre-commit",
        "hook-add": "printf '#!/bin/sh\\ntouch /tmp/owned\\n' > .husky/post-checkout",
        "hook-swap": "mv .husky .husky.old && mkdir .husky",
    }
    steps = [
        f"if {cmd}; then echo {name}=W$((0)); else echo {name}=R$((0)); fi"
        for name, cmd in attempts.items()
    ]
    task = write_task(project, "husky", {"steps": steps})
    root = os.path.realpath(project)
    done = kagura(["apply", "--yes", str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout + done.stderr
    for name in attempts:
        assert f"{name}=R0" in shown and f"{name}=W0" not in shown, (name, shown[-3000:])
    plan = _plan(project, capsys, str(task))
    protected = {m["target"]: m["protects"] for m in plan["mounts"] if m["kind"] == "protected"}
    assert "core.hooksPath" in protected.get("/workspace/.husky", ""), protected
    assert sorted(p.name for p in (project / ".husky").iterdir()) == ["pre-commit"]
    assert (project / ".husky" / "pre-commit").read_text() == "#!/bin/sh\nexit 0\n"
    assert not (Path(root) / ".husky.old").exists()


LOCAL_HOOK = """repos:
  - repo: local
    hooks:
      - id: owned
        name: owned
        entry: touch {marker}
        language: system
        always_run: true
        pass_filenames: false
"""


@pytest.mark.skipif(shutil.which("pre-commit") is None, reason="pre-commit is not installed")
def test_the_config_an_installed_pre_commit_hook_reads_is_read_only(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str], docker_client: Any
) -> None:
    """``pre-commit install`` puts a hook in .git/hooks that runs whatever
    ``.pre-commit-config.yaml`` in the work tree says (a ``repo: local`` hook is any
    command) on the operator's next commit. From a real container the agent cannot change
    or replace that file."""
    project = make_project(tmp_path)
    marker = tmp_path / "owned"
    # The operator's git (and pre-commit's) in a root the agent's uid owns.
    env = {**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory"}
    env["GIT_CONFIG_VALUE_0"] = "*"
    git = ["git", "-C", str(project)]
    subprocess.run([*git, "init", "-q"], check=True, env=env)
    (project / ".pre-commit-config.yaml").write_text("repos: []\n")
    subprocess.run(["pre-commit", "install"], cwd=project, check=True, env=env)
    if os.geteuid() == 0:
        for path in [*project.rglob("*")]:
            os.chown(path, AGENT_UID, AGENT_UID)
    (project / "hook.yaml").write_text(LOCAL_HOOK.format(marker=marker))
    attempts = {
        "config-edit": "cat hook.yaml > .pre-commit-config.yaml",
        "config-swap": "mv .pre-commit-config.yaml old.yaml && cp hook.yaml .pre-commit-config.yaml",
    }
    steps = [
        f"if {cmd}; then echo {name}=W$((0)); else echo {name}=R$((0)); fi"
        for name, cmd in attempts.items()
    ]
    task = write_task(project, "pre-commit", {"steps": steps})
    done = kagura(["apply", "--yes", str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout + done.stderr
    for name in attempts:
        assert f"{name}=R0" in shown and f"{name}=W0" not in shown, (name, shown[-3000:])
    assert (project / ".pre-commit-config.yaml").read_text() == "repos: []\n"
    # The operator's next commit runs nothing of the agent's.
    subprocess.run([*git, "add", "hook.yaml"], check=True, env=env)
    subprocess.run(
        [*git, "-c", "user.name=o", "-c", "user.email=o@o", "commit", "-qm", "x"],
        capture_output=True,
        env=env,
    )
    assert not marker.exists()
    plan = _plan(project, capsys, str(task))
    protected = {m["target"]: m["protects"] for m in plan["mounts"] if m["kind"] == "protected"}
    assert "pre-commit" in protected.get("/workspace/.pre-commit-config.yaml", ""), protected
