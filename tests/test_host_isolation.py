"""No host process imports from, or runs in, a place an agent writes (kagura_agent/hostproc.py).

- The guard: read statically (ast), every process start in the package goes through
  hostproc (its checks refuse a Python that is not isolated, a Python working directory
  other than the file system's root, and an environment naming start-up code). A new
  ``subprocess.run``, ``asyncio.create_subprocess_exec``, ``os.exec*`` or
  ``sys.executable`` anywhere else fails here, naming the file and line.
- The attack: modules that shadow kagura_agent, the standard library and our dependencies,
  ``sitecustomize``, ``usercustomize`` and a ``.pth`` (tests/planting.py) are planted in project roots, in the folders apply, serve and the runner are
  started from and plans are made from, and in state folders; each writes a marker when
  imported. Real runs drive every entry point that starts a process — a dispatch from a
  running agent, a ``runtime: host`` brain and its verify, a ``serve`` launch, a team
  runner's job, the aftercare's and the planner's git — and no marker may appear.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, last_json, make_project, manifest_set, write_task
from planting import marks_left, plant, planting_step
from team_helpers import wait_registered

from kagura_agent import hostproc

PACKAGE = REPO / "kagura_agent"

# (file, function) -> why it may start a process without hostproc.
ALLOWED = {
    ("brain/engines/script.py", "_run_step"): "the agent's own steps: its processes, run by"
    " the brain in its container (on the host only under runtime: host, the operator's choice)",
    ("brain/guard.py", "run_as_init"): "fork without exec: the container's init serving on",
}
_SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output", "getoutput"}
_OS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
_ASYNC = {"create_subprocess_exec", "create_subprocess_shell", "subprocess_exec"}


def _starts(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, enclosing function, what) for each process start or sys.executable."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        called = node.func if isinstance(node, ast.Call) else None
        if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name):
            owner, name = called.value.id, called.attr
            if (
                (owner == "subprocess" and name in _SUBPROCESS)
                or (owner == "os" and (name in _OS or name.startswith(("exec", "spawn"))))
                or (owner == "pty" and name in ("spawn", "fork"))
            ):
                found.append((node.lineno, function, f"{owner}.{name}"))
        if isinstance(called, ast.Attribute) and called.attr in _ASYNC:
            found.append((node.lineno, function, called.attr))
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) == ("sys", "executable")
        ):
            found.append((node.lineno, function, "sys.executable"))
        if isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "multiprocessing"):
            found.append((node.lineno, function, f"from {node.module} import"))
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "multiprocessing" for a in node.names
        ):
            found.append((node.lineno, function, "import multiprocessing"))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_every_process_start_goes_through_hostproc() -> None:
    bypasses = []
    allowed_seen = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "hostproc.py":
            continue
        for line, function, what in _starts(ast.parse(path.read_text(), str(path))):
            if (rel, function) in ALLOWED:
                allowed_seen.add((rel, function))
                continue
            bypasses.append(f"kagura_agent/{rel}:{line} ({function}): {what}")
    assert bypasses == [], "start processes through kagura_agent.hostproc:\n" + "\n".join(bypasses)
    assert allowed_seen == set(ALLOWED)  # no stale exception


def test_the_guard_sees_each_way_of_starting_a_process() -> None:
    source = """
import subprocess, os, sys, asyncio
from subprocess import run
def a(): subprocess.Popen(["x"])
async def b(): await asyncio.create_subprocess_exec("x")
def c(): os.execvp("x", ["x"])
def d(): return [sys.executable, "-m", "kagura_agent"]
def e(): os.fork()
"""
    whats = sorted(what for _, _, what in _starts(ast.parse(source)))
    assert whats == sorted(
        [
            "from subprocess import",
            "subprocess.Popen",
            "create_subprocess_exec",
            "os.execvp",
            "sys.executable",
            "os.fork",
        ]
    )


@pytest.mark.parametrize(
    ("argv", "cwd", "env", "problem"),
    [
        ([sys.executable, "-m", "kagura_agent"], "/", {}, "without -I"),
        (["python3", "-c", "pass"], "/", {}, "without -I"),
        (["/usr/bin/python3.11", "-E", "-s", "x.py"], "/", {}, "without -I"),
        ([sys.executable, "-I", "-c", "pass"], "/tmp", {}, "started in /tmp"),
        (["git", "status"], "work", {}, "relative working directory"),
        (["git", "status"], "/", {"PYTHONPATH": "/x"}, "PYTHONPATH"),
        (["bash", "-c", "true"], "/", {"BASH_ENV": "/x"}, "BASH_ENV"),
    ],
)
def test_an_unsafe_start_is_refused(
    argv: list[str], cwd: str, env: dict[str, str], problem: str
) -> None:
    with pytest.raises(hostproc.UnsafeStart, match=problem):
        hostproc.run(argv, cwd=cwd, env=env)


def test_isolated_forms_and_the_environment() -> None:
    assert hostproc.isolated([sys.executable, "-I", "-c", "pass"])
    assert hostproc.isolated(["python3", "-P", "-E", "-s", "-m", "x"])
    assert not hostproc.isolated(["python3", "-c", "-I"])  # -I after -c is an argument
    env = hostproc.environment(
        {"KAGURA_X": "1"},
        base={
            "PATH": "/usr/bin:.:bin::/bin",
            "PYTHONPATH": ".",
            "PYTHONSTARTUP": "x.py",
            "BASH_ENV": "x.sh",
            "ENV": "x.sh",
            "HOME": "/root",
        },
    )
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/root", "KAGURA_X": "1"}


def test_an_isolated_child_runs_this_very_package_from_anywhere(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    plant(tmp_path / "here", marks, "cwd")
    code = "import kagura_agent, json, yaml\nprint(kagura_agent.__file__)"
    done = hostproc.run(
        hostproc.python_code_argv(code),
        env=hostproc.environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == str(PACKAGE / "__init__.py")
    assert marks_left(marks) == []


def test_a_child_reads_the_operator_folder_of_the_folder_it_works_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child starts in the neutral folder, yet ./manifests is its parent's: a team
    runner started beside a State manifest naming PostgreSQL records its jobs there."""
    here = tmp_path / "here"
    (here / "manifests").mkdir(parents=True)
    (here / "manifests" / "state.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: State\nmetadata: {name: team}\n"
        "spec: {backend: postgres, url: 'env:KAGURA_TEST_TEAM_DB'}\n"
    )
    monkeypatch.setenv("KAGURA_TEST_TEAM_DB", "postgresql://kagura@db.example:5432/kagura")
    monkeypatch.chdir(here)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    monkeypatch.delenv("KAGURA_AGENT_STATE_URL", raising=False)
    code = (
        "import os\nfrom kagura_agent.state import state_location\n"
        "print(os.getcwd(), state_location())"
    )
    done = hostproc.run(
        hostproc.python_code_argv(code),
        env=hostproc.kagura_environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [
        hostproc.NEUTRAL_CWD,
        "postgresql://kagura@db.example:5432/kagura",
    ]


# --- the attack: planted modules, real entry points --------------------------------------


def _kagura_from(cwd: Path, args: list[str], env: dict[str, str], timeout: float = 300) -> Any:
    """kagura-agent run by the operator from ``cwd`` (itself isolated: only the processes
    it starts are under test)."""
    return subprocess.run(
        hostproc.kagura_argv(*args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture()
def marks(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def _git_init(folder: Path) -> None:
    subprocess.run(["git", "init", "-q", str(folder)], check=True)


def test_a_dispatch_from_a_running_agent_imports_nothing_it_wrote(
    docker_client: Any, tmp_path: Path, state_dir: Path, marks: Path
) -> None:
    """The agent writes shadowing modules into its root, then dispatches a child: the host
    starts the child's apply (the parent was started from the root)."""
    from testing.agent_test_image import ensure_agent_test_image

    image_ref = ensure_agent_test_image(docker_client)
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    manifests = manifest_set(tmp_path, image)
    project = make_project(tmp_path)
    _git_init(project)
    state_dir.mkdir(parents=True, exist_ok=True)
    plant(state_dir, marks, "state")
    dispatch = (
        "cd /tmp && python3 -m kagura_agent.brain.memtool dispatch 'the child'"
        " --name child --step 'echo child > child.txt' --verify 'test -s child.txt'"
    )
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "steps": [planting_step(marks, "root"), dispatch],
            "verify": ["test -s child/child.txt"],
        },
    )
    env = cli_env(state_dir)
    done = _kagura_from(project, ["apply", "--yes", "--json", "--manifests", str(manifests),
                                  str(task)], env)  # fmt: skip
    assert marks_left(marks) == []
    assert done.returncode == 0, done.stderr[-4000:]
    result = last_json(done.stdout)
    [child] = result["children"]
    assert child["outcome"] == "success", child
    assert (project / "kagura_agent" / "__init__.py").exists()  # the agent did plant them
    assert (project / "child" / "child.txt").read_text() == "child\n"


@pytest.mark.usefixtures("without_docker")
def test_a_host_runtime_brain_and_its_verify_import_nothing_from_the_root(
    tmp_path: Path, state_dir: Path, marks: Path
) -> None:
    """``runtime: host``: the brain's entrypoint is a host process; a previous run left
    shadowing modules in the root the operator applies from."""
    project = tmp_path / "project"
    project.mkdir()
    _git_init(project)
    plant(project, marks, "root")
    task = write_task(
        project,
        "on-host",
        {"runtime": "host", "steps": ["echo ran > host.txt"], "verify": ["grep -qx ran host.txt"]},
    )
    env = cli_env(state_dir)
    done = _kagura_from(project, ["apply", "--yes", "--allow-host-runtime", str(task)], env)
    assert marks_left(marks) == []
    assert done.returncode == 0, done.stderr[-4000:]
    assert (project / "host.txt").read_text() == "ran\n"


def test_a_serve_launch_imports_nothing_from_where_serve_runs(
    docker_client: Any, tmp_path: Path, state_dir: Path, marks: Path
) -> None:
    """serve started in a folder holding shadowing modules (an agent's root, say), with a
    task planned from such a folder: the apply it launches imports none of them."""
    manifests = manifest_set(tmp_path)
    ops = tmp_path / "ops"
    ops.mkdir()
    plant(ops, marks, "cwd")
    state_dir.mkdir(parents=True, exist_ok=True)
    plant(state_dir, marks, "state")
    project = make_project(tmp_path)
    task = write_task(project, "quick", {"steps": ["echo hello > out.txt"], "verify": ["true"]})
    moved = ops / "task.yml"
    task.rename(moved)
    text = moved.read_text().replace("spec:\n", f"spec:\n  project_root: {project}\n", 1)
    moved.write_text(text)
    env = cli_env(state_dir)
    serve = subprocess.Popen(
        hostproc.kagura_argv("serve", "--manifests", str(manifests)),
        cwd=ops,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert serve.stdin is not None and serve.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(serve.stdout or []), daemon=True)
    reader.start()
    try:
        serve.stdin.write("launch task.yml\n")
        serve.stdin.flush()
        deadline = time.monotonic() + 240
        while not any("succeeded in" in line or "failed" in line for line in lines):
            assert time.monotonic() < deadline and serve.poll() is None, "".join(lines)
            time.sleep(0.2)
        serve.stdin.close()  # Ctrl-D: serve ends
        serve.wait(120)
        reader.join(10)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    out = "".join(lines)
    assert marks_left(marks) == []
    assert "succeeded" in out, out[-4000:]


@pytest.mark.timeout(600)
def test_a_team_runners_job_imports_nothing_from_where_it_or_the_plan_was_made(
    docker_client: Any, tmp_path: Path, state_dir: Path, marks: Path, postgres_server: Any
) -> None:
    """A runner started in a folder of shadowing modules takes a job whose plan was made
    from another such folder: its warm apply child imports none of them."""
    from kagura_agent.plan.build import plan_tasks
    from kagura_agent.team import queue

    manifests = manifest_set(tmp_path)
    where = tmp_path / "runner-cwd"
    where.mkdir()
    plant(where, marks, "cwd")
    ops = tmp_path / "ops"
    ops.mkdir()
    plant(ops, marks, "planned")
    project = make_project(tmp_path)
    task = write_task(project, "job", {"steps": ["echo job > out.txt"], "verify": ["true"]})
    moved = ops / "task.yml"
    task.rename(moved)
    text = moved.read_text().replace("spec:\n", f"spec:\n  project_root: {project}\n", 1)
    moved.write_text(text)
    runner_state = tmp_path / "runner-state"
    runner_state.mkdir()
    plant(runner_state, marks, "state")
    here = os.getcwd()
    os.chdir(ops)
    try:
        [plan] = plan_tasks(str(manifests), ["task.yml"])
    finally:
        os.chdir(here)
    with postgres_server.fresh_database() as url:
        env = cli_env(state_dir, KAGURA_AGENT_QUEUE_URL=url)
        runner = subprocess.Popen(
            hostproc.kagura_argv("runner", "--name", "r1", "--state-dir", str(runner_state)),
            cwd=where,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_registered(url, 1)
            queued = queue.enqueue_plan(url, plan, who="test")
            deadline = time.monotonic() + 300
            while (row := queue.run(url, queued.run_id))["status"] not in queue.TERMINAL:
                assert time.monotonic() < deadline and runner.poll() is None, row
                time.sleep(0.5)
        finally:
            runner.terminate()
            out, _ = runner.communicate(timeout=120)
    assert marks_left(marks) == []
    assert row["status"] == "success", (row, out[-4000:])
    assert (project / "out.txt").read_text() == "job\n"


@pytest.mark.usefixtures("without_docker")
def test_review_and_plan_base_run_git_importing_nothing(
    tmp_path: Path, state_dir: Path, marks: Path
) -> None:
    """``review --base`` and ``plan --base`` read the manifests at a revision with git, run
    from inside a repository holding planted modules. (git imports no Python module: this
    holds on the old code too; it is here so that every start is driven.)"""
    repo = tmp_path / "ops"
    _git_init(repo)
    manifest_set(repo)
    write_task(repo, "reviewed", {"steps": ["true"], "project_root": str(make_project(tmp_path))})
    plant(repo, marks, "repo")
    env = cli_env(state_dir)
    commit = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]
    for args in (["git", "add", "-A"], commit):
        subprocess.run(args, cwd=repo, check=True, env=env)
    (repo / "task.yml").write_text((repo / "task.yml").read_text() + "# changed\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
    subprocess.run([*commit[:-1], "y"], cwd=repo, check=True, env=env)
    reviewed = _kagura_from(
        repo, ["review", "--base", "HEAD~1", "--manifests", "manifests"], env, timeout=120
    )
    planned = _kagura_from(
        repo, ["plan", "task.yml", "--manifests", "manifests", "--base", "HEAD~1"], env
    )
    assert marks_left(marks) == []
    assert reviewed.returncode == 0, reviewed.stderr
    assert "reviewed" in reviewed.stdout
    assert planned.returncode == 0, planned.stderr


def _docs_block(heading: str) -> str:
    text = (REPO / "docs" / "membrane.md").read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    return block


def kagura_on_path(folder: Path) -> dict[str, str]:
    """A ``kagura-agent`` command on PATH running this checkout (isolated, as installed)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "kagura-agent"
    script.write_text("#!/bin/sh\nexec " + shlex.join(hostproc.kagura_argv()) + ' "$@"\n')
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.mark.usefixtures("without_docker")
def test_the_docs_example_runs_a_shadowed_root_on_the_host(tmp_path: Path, state_dir: Path) -> None:
    block = _docs_block("## No host process runs what the agent wrote")
    env = cli_env(state_dir, TMPDIR=str(tmp_path), **kagura_on_path(tmp_path / "bin"))
    done = subprocess.run(
        ["bash", "-euc", block], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "succeeded" in done.stderr and "imported a module" not in done.stderr


def test_the_tests_model_route_reaches_isolated_children(tmp_path: Path) -> None:
    """testing/route/sitecustomize.py reaches the processes tests start through PYTHONPATH;
    the children kagura starts ignore it (-I), and get the route in their start code."""
    from testing.fake_anthropic import Route, route_env

    fake = Route(network="net", address="10.0.0.9", port=8080)
    child = "from kagura_agent.apply.run import executor\nprint(executor.DockerApplyRuntime)"
    parent = (
        "from kagura_agent import hostproc\n"
        f"done = hostproc.run(hostproc.python_code_argv({child!r}), env=hostproc.environment(),"
        " capture_output=True, text=True, check=True)\n"
        "print(done.stdout)"
    )
    env = {**os.environ, **route_env(fake)}
    done = subprocess.run(
        [sys.executable, "-c", parent], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "FakeAnthropicRuntime" in done.stdout and "10.0.0.9" in done.stdout
