"""Every file a command reads because a user named it is read bounded and never blocks:
a FIFO, a device or a directory where a file is expected is a clear error (exit 2),
through the real CLI in a child process (forked, testing/forked.py: a read that blocks
holds only the child, which the timeout kills).

Before (kagura_agent/inputfile.py), a FIFO named *.yml in the manifest folder hung
validate, plan, graduation and every command that looks for the State manifest (leases,
memory, ...); ``/dev/zero`` linked into the folder made those read without end (memory
growing until killed); ``show``, ``--against``, ``--facts`` and ``run --prompt-file``
blocked on a FIFO; ``run --prompt-file`` of ``/dev/zero`` read forever and of a binary
file ended in a UnicodeDecodeError traceback; ``run -`` read all of standard input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testing import forked

REPO = Path(__file__).resolve().parent.parent
HELLO = (
    "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: hello}\nspec:\n"
    "  project_root: .\n  steps: [echo hi]\n"
)
# Each case is far below this; a blocked read runs into it and fails the test.
TIMEOUT = 30


def cli(cwd: Path, *argv: str, stdin: bytes = b"", **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "KAGURA_AGENT_STATE_DIR": str(cwd.parent / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(cwd.parent / "cache"),
        "NO_COLOR": "1",
        **env,
    }
    if "KAGURA_AGENT_MANIFESTS" not in env:
        full.pop("KAGURA_AGENT_MANIFESTS", None)
    return forked.run(argv, cwd=cwd, env=full, stdin=stdin, timeout=TIMEOUT).text()


def refused(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert fragment in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def make(path: Path, what: str) -> str:
    """``path`` as a FIFO, a link to /dev/zero or a directory; the reason expected."""
    if what == "fifo":
        os.mkfifo(path)
        return "it is a FIFO (named pipe), not a regular file"
    if what == "dev-zero":
        path.symlink_to("/dev/zero")
        return "it is a character device, not a regular file"
    path.mkdir()
    return "it is a directory, not a regular file"


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "task.yml").write_text(HELLO, encoding="utf-8")
    facts = {"image_digests": {}, "graduation": {"version": 0}}
    (root / "facts.json").write_text(json.dumps(facts), encoding="utf-8")
    shutil.copytree(REPO / "manifests", root / "manifests")
    return root


@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_a_special_file_in_the_manifest_folder_is_a_located_error(project: Path, what: str) -> None:
    reason = make(project / "manifests" / "extra.yml", what)
    for argv in (
        ["validate", "--manifests", "manifests", "task.yml"],
        ["plan", "--facts", "facts.json", "--manifests", "manifests", "task.yml"],
        ["graduation", "status", "--manifests", "manifests"],
    ):
        proc = cli(project, *argv)
        refused(proc, f"cannot read file: {reason}")
        assert proc.stderr.rstrip().endswith("error: 1 validation error"), proc.stderr
    # memory reads the set (its Memory manifest); leases only looks for the State
    # manifest, skipping what it cannot read.
    proc = cli(project, "memory", "search", "x", KAGURA_AGENT_MANIFESTS="manifests")
    refused(proc, f"cannot read file: {reason}")
    proc = cli(project, "leases", "list", KAGURA_AGENT_MANIFESTS="manifests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("what", ["fifo", "dev-zero", "directory"])
def test_a_special_file_named_as_input_is_refused(project: Path, what: str) -> None:
    reason = make(project / "special", what)
    plan = ["plan", "--manifests", "manifests", "--facts", "facts.json"]
    for argv, fragment in (
        (["show", "special"], f"cannot read plan special: {reason}"),
        ([*plan, "--against", "special", "task.yml"], f"cannot read plan special: {reason}"),
        (
            [*plan[:-2], "--facts", "special", "task.yml"],
            f"cannot read facts file special: {reason}",
        ),
        (["run", "--prompt-file", "special"], f"cannot read special: {reason}"),
    ):
        for extra in ([], ["--json"]):
            proc = cli(project, *argv, *extra)
            refused(proc, fragment)
            if extra:
                assert json.loads(proc.stdout)["ok"] is False


def test_a_prompt_file_is_bounded_and_utf8(project: Path) -> None:
    (project / "big.txt").write_bytes(b"a" * (2 * 2**20))
    refused(
        cli(project, "run", "--prompt-file", "big.txt"),
        "cannot read big.txt: it is 2097152 bytes, more than the 1 MiB allowed",
    )
    (project / "latin1.txt").write_bytes("say hi\nto Ren\xe9e\n".encode("latin-1"))
    refused(
        cli(project, "run", "--prompt-file", "latin1.txt", "--json"),
        "cannot read latin1.txt: not UTF-8 text (byte 0xe9 at line 2, column 7)",
    )
    refused(
        cli(project, "run", "-", stdin=b"x" * (2 * 2**20)),
        "the task on standard input is more than 1024 KiB",
    )
    refused(cli(project, "run", "-", stdin=b"\xff\xfe"), "standard input: not UTF-8 text")


def test_a_path_that_leads_nowhere_says_why(project: Path) -> None:
    # Before, a symlink loop, a dangling link and a file given as --manifests all read
    # "does not exist", which sends the operator looking for a missing file.
    (project / "loop.yml").symlink_to("loop.yml")
    (project / "dangling.yml").symlink_to("gone.yml")
    cases = (
        (
            ["validate", "loop.yml"],
            "error: loop.yml cannot be read: Too many levels of symbolic links",
        ),
        (
            ["plan", "dangling.yml"],
            "error: dangling.yml is a symlink to 'gone.yml', which does not exist",
        ),
        (
            ["validate", "--manifests", "task.yml"],
            "error: manifests directory task.yml is not a directory",
        ),
        (
            ["validate", "--manifests", "loop.yml"],
            "error: manifests directory loop.yml cannot be read: Too many levels of symbolic links",
        ),
        (["validate", "missing.yml"], "error: missing.yml does not exist"),
    )
    for argv, fragment in cases:
        refused(cli(project, *argv), fragment)
