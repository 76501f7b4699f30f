"""User mistakes that used to end in a traceback (exit 1, "task failed") are located
errors with exit 2, through the real CLI (its main, in process: testing/inprocess.py).

- ``plan -o`` into a path that cannot be written;
- ``cpus: .nan`` / ``.inf`` in an Image (NaN passed the schema's range checks, then
  ``int(nan)`` failed in the planner);
- ``project_root: /proc/1/root`` (realpath raised PermissionError);
- ``show`` of a plan nested past what any plan is (RecursionError in the decoder);
- ``graduation reset`` of a category nothing defines (wrote a phantom row);
- ``run --brain nosuch`` (the error pointed at an internal generated task file).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kagura_agent.plan.planner import fingerprint
from testing.inprocess import run_main

REPO = Path(__file__).resolve().parent.parent
FACTS = {"image_digests": {}, "graduation": {"version": 0}}
HELLO = (
    "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: hello}\nspec:\n"
    "  project_root: .\n  steps: [echo hi]\n"
)


def cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        # Beside the project, not in it: a project root may not contain the state.
        "KAGURA_AGENT_STATE_DIR": str(cwd.parent / "state"),
        # A fresh check cache: a pass cached by an older loader must not hide the case.
        "KAGURA_AGENT_CACHE_DIR": str(cwd.parent / "cache"),
        "NO_COLOR": "1",
    }
    env.pop("KAGURA_AGENT_MANIFESTS", None)
    return run_main(argv, cwd=cwd, env=env)


def refused(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert fragment in proc.stderr, proc.stderr


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "task.yml").write_text(HELLO, encoding="utf-8")
    (root / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    return root


def plan_argv(*extra: str, manifests: str | None = None) -> list[str]:
    return ["plan", "--manifests", manifests or str(REPO / "manifests"), "--facts", "facts.json"]


@pytest.mark.parametrize("target", ["/proc/plan.json", "/proc/version", "/", "task.yml/plan.json"])
def test_plan_out_to_an_impossible_path(project: Path, target: str) -> None:
    proc = cli(project, *plan_argv(), "-o", target, "task.yml")
    refused(proc, f"cannot write plan to {target}")
    assert not list(project.glob(".plan-*"))


@pytest.mark.parametrize("value", [".nan", ".NaN", ".inf", "-.inf"])
def test_cpus_not_a_finite_number(project: Path, value: str) -> None:
    manifests = project / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    images = manifests / "images.yml"
    text = images.read_text(encoding="utf-8")
    assert "    cpus: " in text
    lines = [
        f"    cpus: {value}" if line.startswith("    cpus: ") else line
        for line in text.splitlines()
    ]
    images.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = cli(project, *plan_argv(manifests=str(manifests)), "task.yml")
    refused(proc, f"$.spec.hardening.cpus  '{value}' is not of type 'number'")
    assert proc.stderr.startswith("manifests/images.yml:")


def test_project_root_proc_1_root(project: Path) -> None:
    (project / "task.yml").write_text(
        HELLO.replace("project_root: .", "project_root: /proc/1/root"), encoding="utf-8"
    )
    proc = cli(project, *plan_argv(), "task.yml")
    # Unreadable as here (a PermissionError) or readable (it is then the host root):
    # either way a located refusal.
    refused(proc, "$.spec.project_root")
    assert proc.stderr.startswith("task.yml:5:")


def test_show_of_a_deeply_nested_plan(project: Path) -> None:
    saved = cli(project, *plan_argv(), "-o", "plan.json", "task.yml")
    assert saved.returncode == 0, saved.stderr
    text = (project / "plan.json").read_text(encoding="utf-8")
    deep = "[" * 100_000 + "]" * 100_000
    (project / "deep.json").write_text(
        text.replace('"format_version"', f'"junk": {deep}, "format_version"', 1), encoding="utf-8"
    )
    refused(cli(project, "show", "deep.json"), "nested too deeply")
    # Deep enough to pass the decoder, with a valid fingerprint: still not a plan.
    plan = json.loads(text)
    nested: list[object] = []
    plan["task"]["junk"] = nested
    for _ in range(40):
        nested.append([])
        nested = nested[0]  # type: ignore[assignment]
    plan["fingerprint"] = fingerprint(plan)
    (project / "deep2.json").write_text(json.dumps(plan), encoding="utf-8")
    refused(cli(project, "show", "deep2.json"), "nested deeper than 32 levels")


def test_graduation_reset_of_an_unknown_category_writes_nothing(project: Path) -> None:
    proc = cli(project, "graduation", "reset", "image:nosuch", "--who", "alice")
    refused(proc, "no capability category 'image:nosuch'")
    history = cli(project, "graduation", "history", "--json")
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout) == {
        "ok": True,
        "errors": [],
        "decisions": [],
        "graduation_events": [],
    }
    status = cli(project, "graduation", "status", "--json")
    assert json.loads(status.stdout)["categories"] == {}
    # A category the manifests define may be reset before it has evidence.
    known = cli(project, "graduation", "reset", "image:agent", "--who", "alice")
    assert known.returncode == 0, known.stderr


@pytest.mark.parametrize(
    ("flag", "value", "kind"),
    [
        ("--brain", "nosuch", "Brain"),
        ("--image", "nope", "Image"),
        ("--egress", "nah", "EgressPolicy"),
    ],
)
def test_run_with_an_unknown_name_points_at_the_flag(
    project: Path, flag: str, value: str, kind: str
) -> None:
    proc = cli(project, "run", "--manifests", str(REPO / "manifests"), flag, value, "say hi")
    refused(proc, f"error: {flag} {value}: no {kind} of that name")
    assert "adhoc" not in proc.stderr and ".yml" not in proc.stderr
    adhoc = project.parent / "state" / "adhoc"
    assert not adhoc.exists() or not list(adhoc.iterdir())


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "is nested too deeply"),
        ('{"image_digests": 5}', "has the wrong shape"),
        ("[1, 2]", "must hold a JSON object"),
        ("\xff", "cannot read facts file"),
    ],
    ids=["deep", "wrong-type", "not-an-object", "not-utf8"],
)
def test_plan_facts_file_of_the_wrong_shape(project: Path, text: str, fragment: str) -> None:
    (project / "facts.json").write_text(text, encoding="latin-1")
    refused(cli(project, *plan_argv(), "task.yml"), fragment)


@pytest.mark.parametrize(
    ("where", "text", "line", "col", "path"),
    [
        (
            "task",
            HELLO.replace("project_root: .", 'project_root: "a\\0b"'),
            5,
            17,
            "$.spec.project_root",
        ),
        (
            "task",
            HELLO + '  mounts: [{source: "/tmp\\0x", target: /x}]\n',
            7,
            21,
            "$.spec.mounts[0].source",
        ),
        ("task", HELLO + '  vars: {"k\\0": 1}\n', 7, 10, "$.spec.vars"),
        ("policy", 'spec:\n  secret_dirs: ["/tmp\\0x"]\n', 5, 17, "$.spec.secret_dirs[0]"),
    ],
    ids=["project-root", "mount-source", "key", "policy-secret-dir"],
)
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_nul_character_anywhere_is_a_located_error(
    project: Path, command: str, where: str, text: str, line: int, col: int, path: str
) -> None:
    # A "\0" escape used to reach os.path.realpath (project_root): ValueError, a traceback.
    manifests = project / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    file = "task.yml"
    if where == "policy":
        file = "manifests/extra.yml"
        text = "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: extra}\n" + text
    (project / file).write_text(text, encoding="utf-8")
    argv = [command, "--manifests", "manifests", "task.yml"]
    if command == "plan":
        argv[1:1] = ["--facts", "facts.json"]
    for extra in ([], ["--json"]):
        proc = cli(project, *argv, *extra)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        if extra:
            (error,) = json.loads(proc.stdout)["errors"]
            assert (error["file"], error["line"], error["col"], error["path"]) == (
                file,
                line,
                col,
                path,
            )
            assert "NUL character" in error["message"]
        else:
            assert proc.stderr.startswith(f"{file}:{line}:{col}  {path}  text contains a NUL")


@pytest.mark.parametrize(
    "argv",
    [
        ["memory", "show", "\udcffa"],
        ["memory", "forget", "\udcffa", "--who", "alice"],
        ["egress", "log", "\udcffa"],
        ["plan", "--manifests", str(REPO / "manifests"), "\udcffa.yml"],
    ],
    ids=["memory-show", "memory-forget", "egress-log", "plan"],
)
def test_an_argument_that_is_not_utf8_is_a_usage_error(project: Path, argv: list[str]) -> None:
    # Python carries the bytes of a non-UTF-8 argument as lone surrogates: memory show
    # and egress log passed them to SQLite (UnicodeEncodeError, a traceback).
    index = next(i for i, word in enumerate(argv, start=1) if "\udcff" in word)
    for extra in ([], ["--json"]):
        proc = cli(project, *argv, *extra)
        refused(proc, f"error: argument {index} is not UTF-8 text: \\xffa")
        if extra:
            assert json.loads(proc.stdout)["ok"] is False


def test_a_project_folder_whose_name_is_not_utf8_makes_no_plan(project: Path) -> None:
    # From a folder named with a byte that is not UTF-8, `plan -o` was a traceback
    # (UnicodeEncodeError writing the plan) and `plan --json` printed invalid UTF-8.
    odd = Path(os.fsdecode(bytes(project) + b"-\xff"))
    odd.mkdir()
    shutil.copy(project / "task.yml", odd / "task.yml")
    shutil.copy(project / "facts.json", odd / "facts.json")
    for extra in (["-o", "plan.json"], ["--json"]):
        proc = cli(odd, *plan_argv(), *extra, "task.yml")
        refused(proc, "error: the plan's $.task.path is not UTF-8 text: ")
        assert proc.stderr.splitlines()[0].endswith("project-\\xff/task.yml"), proc.stderr
        assert not (odd / "plan.json").exists()
        if "--json" in extra:
            assert json.loads(proc.stdout)["ok"] is False


@pytest.mark.parametrize(
    ("variable", "argv"),
    [
        ("KAGURA_AGENT_STATE_DIR", ["leases", "list"]),
        ("KAGURA_AGENT_STATE_DIR", ["graduation", "status"]),
        ("KAGURA_AGENT_CACHE_DIR", ["validate", "--manifests", str(REPO / "manifests")]),
    ],
    ids=["state-leases", "state-graduation", "cache-validate"],
)
def test_a_relative_state_or_cache_dir_is_refused(
    project: Path, variable: str, argv: list[str]
) -> None:
    # A relative state directory was a different ledger and graduation store in every
    # working directory: leases list from the project made ./rel/state.db there.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KAGURA_AGENT_STATE_DIR": str(project.parent / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(project.parent / "cache"),
        variable: "rel",
    }
    env.pop("KAGURA_AGENT_MANIFESTS", None)
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "kagura_agent", *argv, *extra],
            cwd=project,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        assert f"error: {variable} must be an absolute path, not 'rel'" in proc.stderr
        assert not (project / "rel").exists()
        if extra:
            assert json.loads(proc.stdout)["exit_code"] == 3


@pytest.mark.parametrize(
    ("file", "old", "new", "path"),
    [
        ("graduation.yml", "cooldown: 7d", "cooldown: 99999999999999999999d", "$.spec.cooldown"),
        (
            "graduation.yml",
            "cooldown: 7d",
            "cooldown: 7d\n  failure_half_life: 99999999999999999999d",
            "$.spec.failure_half_life",
        ),
        ("images.yml", "memory: 2g", "memory: 99999999999999999999g", "$.spec.hardening.memory"),
    ],
    ids=["cooldown", "failure-half-life", "image-memory"],
)
def test_a_duration_or_size_past_any_use_is_a_located_error(
    project: Path, file: str, old: str, new: str, path: str
) -> None:
    # Durations and sizes took any number of digits: a Graduation cooldown of 10**20
    # days was an OverflowError traceback (timedelta) from plan and graduation status.
    manifests = project / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    target = manifests / file
    text = target.read_text(encoding="utf-8")
    assert old in text
    target.write_text(text.replace(old, new, 1), encoding="utf-8")
    for argv in (
        [*plan_argv(manifests="manifests"), "task.yml"],
        ["graduation", "status", "--manifests", "manifests"],
    ):
        proc = cli(project, *argv)
        refused(proc, f"{path}  '{new.split(': ')[-1]}' is not valid here")
        assert proc.stderr.startswith(f"manifests/{file}:"), proc.stderr


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["graduation", "history", "--limit", "99999999999999999999"], "is not in 1..100000"),
        (["graduation", "history", "--limit", "-1"], "-1 is not in 1..100000"),
        (["memory", "search", "-k", "99999999999999999999", "x"], "is not in 0..1000"),
        (["serve", "--approval-timeout", "nan"], "nan is not in 0..604800 seconds"),
        (["runner", "--heartbeat", "inf"], "inf is not in 0.01..3600 seconds"),
        (["apply", "--approval-timeout", "-5", "task.yml"], "-5 is not in 0..604800 seconds"),
    ],
    ids=["limit-huge", "limit-negative", "k-huge", "timeout-nan", "heartbeat-inf", "timeout-neg"],
)
def test_a_number_option_out_of_range_is_a_usage_error(
    project: Path, argv: list[str], fragment: str
) -> None:
    # Numeric options took any int or float: --limit 10**20 was an OverflowError
    # traceback from SQLite, --limit -1 meant no limit, nan/inf reached sleeps and clocks.
    for extra in ([], ["--json"]):
        proc = cli(project, *argv, *extra)
        refused(proc, fragment)
        if extra:
            (error,) = json.loads(proc.stdout)["errors"]
            assert fragment in error["message"]
