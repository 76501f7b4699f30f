"""The README's examples run as written: sample plan output, the approval line and its hint.

The sample outputs are checked against what ``plan`` prints today (with fixed facts, so
image digests and the daemon do not matter): every line shown must come out, in order; a
line ending in "…" is a prefix, and a lone "…" stands for lines left out.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testing import forked

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The checkout path the README's samples show.
SHOWN_ROOT = "/home/me/kagura-agent"
FACTS = {
    "image_digests": {"kagura/agent:0.1.0": "sha256:290d3ba93efc" + "0" * 52},
    "project_owner": [1000, 1000],
    "project_mode": 0o755,
    "daemon": {"userns_remap": True, "rootless": False},
}


def _samples() -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of every ``$ kagura-agent plan …`` block."""
    found = []
    for block in re.findall(r"```\n(\$ kagura-agent plan [^\n]+)\n(.*?)```", README, re.S):
        command, output = block
        found.append((command.removeprefix("$ "), output.rstrip("\n").splitlines()))
    return found


def _kagura(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return forked.run(args, cwd=cwd, env=env, timeout=120).text()


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDFLARE")}
    return {
        **clean,
        "PYTHONPATH": str(ROOT),
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"),
        "NO_COLOR": "1",
    }


def test_the_readme_shows_plan_samples() -> None:
    assert [command for command, _ in _samples()] == [
        "kagura-agent plan examples/dns-change/task.yml",
        "kagura-agent plan --manifests examples/denied-paste/manifests examples/denied-paste/task.yml",
    ]


@pytest.mark.parametrize(("command", "shown"), _samples(), ids=lambda v: str(v)[:40])
def test_readme_plan_sample_is_what_plan_prints(
    command: str, shown: list[str], tmp_path: Path, env: dict[str, str]
) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS))
    args = shlex.split(command)[1:]
    done = _kagura([*args, "--facts", str(facts)], env, ROOT)
    # A plan apply would refuse makes plan exit 6 too (README: the exit codes).
    refused = any(line.strip() == "applyable    NO" for line in shown)
    assert done.returncode == (6 if refused else 0), done.stderr
    printed = done.stdout.replace(str(ROOT), SHOWN_ROOT).splitlines()
    at = 0
    for line in shown:
        if line.strip() == "…":
            continue
        prefix = line.endswith("…")
        want = line.removesuffix("…")
        while at < len(printed) and not (
            printed[at].startswith(want) if prefix else printed[at] == line
        ):
            at += 1
        assert at < len(printed), f"README line not printed (in order): {line!r}\n{done.stdout}"
        at += 1


def _validate_samples() -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of every ``$ kagura-agent validate …`` block."""
    found = []
    for block in re.findall(r"```\n(\$ kagura-agent validate [^\n]+)\n(.*?)```", README, re.S):
        command, output = block
        found.append((command.removeprefix("$ "), output.rstrip("\n").splitlines()))
    return found


def test_the_readme_shows_validate_samples() -> None:
    assert [command for command, _ in _validate_samples()] == [
        "kagura-agent validate examples/mistakes/shape.yml",
        "kagura-agent validate examples/mistakes/names.yml",
    ]


@pytest.mark.parametrize(("command", "shown"), _validate_samples(), ids=lambda v: str(v)[:50])
def test_readme_validate_sample_is_what_validate_prints(
    command: str, shown: list[str], env: dict[str, str]
) -> None:
    """Every line as shown, in order and nothing else: the mistakes of one kind at once."""
    done = _kagura(shlex.split(command)[1:], env, ROOT)
    assert done.returncode == 2, done.stderr
    assert (done.stdout + done.stderr).splitlines() == shown


def _readme_apply_line() -> list[str]:
    [line] = [
        line
        for line in README.splitlines()
        if line.startswith("kagura-agent apply --yes --approve")
    ]
    return shlex.split(line.split("#")[0])[1:]


@pytest.mark.usefixtures("docker_client")
def test_readme_approval_example_passes_the_approvals(tmp_path: Path, env: dict[str, str]) -> None:
    """As written it gets past approvals (it stops at the Cloudflare secret, unset here)."""
    project = tmp_path / "examples" / "dns-change"
    shutil.copytree(ROOT / "examples" / "dns-change", project)
    project.chmod(0o777)  # writable by the agent whoever runs the test
    done = _kagura(_readme_apply_line(), env, tmp_path)
    assert done.returncode == 3, done.stderr
    assert "secret env:CLOUDFLARE_ROOT_TOKEN is not set" in done.stderr
    assert "no approval" not in done.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_partial_approval_names_the_missing_flag(tmp_path: Path, env: dict[str, str]) -> None:
    project = tmp_path / "examples" / "dns-change"
    shutil.copytree(ROOT / "examples" / "dns-change", project)
    project.chmod(0o777)
    args = [a for a in _readme_apply_line() if a not in ("--approve", "egress:cloudflare-api")]
    args.insert(args.index("credential:cloudflare/dns-write"), "--approve")
    done = _kagura(args, env, tmp_path)
    assert done.returncode == 6, done.stderr
    assert "no approval for this plan" in done.stderr
    assert "hint: also pass --approve egress:cloudflare-api, or apply without --yes" in done.stderr
    assert "bound to one plan" not in done.stderr


# The quickstart: the README's first five commands, as root and as a normal user.
FIRST_COMMANDS = [
    "python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh",
    "kagura-agent init hello",
    "kagura-agent plan hello/task.yml",
    "kagura-agent images build --missing",
    "kagura-agent apply --yes hello/task.yml",
]
# A normal user: nobody, in the group of Docker's socket (a user in the docker group).
USER_UID = 65534


def _first_commands(count: int = 5) -> list[str]:
    """The README's first ``count`` commands: the first code block's lines, comments left out."""
    block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")][
        :count
    ]


def test_the_readme_starts_with_install_init_plan_build_apply() -> None:
    """What the quickstart test below runs is what the README's first lines say."""
    assert _first_commands() == FIRST_COMMANDS


def _fresh_checkout(target: Path) -> None:
    """A copy of this checkout as a clone would have it (tracked and new files)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _locked_packages(venv: Path) -> None:
    """Put the core lock's packages into ``venv`` as ``pip`` would, from this interpreter's
    own installed copies (each at the version the lock pins, else the test fails): tests
    never reach the package index, so the install in the README's first command finds its
    dependencies already satisfied and installs the checkout alone."""
    from importlib import metadata

    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    pins = re.findall(
        r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements/main.txt").read_text(), re.M
    )
    for name, version in pins:
        if name in ("pywin32",):  # Windows only
            continue
        dist = metadata.distribution(name)
        assert dist.version == version, f"{name} {dist.version} installed, the lock pins {version}"
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            source = base / file
            if ".." in file.parts or not source.is_file():
                continue  # scripts beside the interpreter, files RECORD lists but lacks
            (site / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, site / file)


def _as_user(argv: list[str]) -> list[str]:
    """``argv`` as an unprivileged user in the docker group (the test runs as root)."""
    socket = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    docker_group = os.stat(socket).st_gid
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("tests run as root and setpriv (util-linux) is missing")
    return [
        setpriv,
        f"--reuid={USER_UID}",
        f"--regid={USER_UID}",
        f"--groups={docker_group}",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *argv,
    ]


@pytest.mark.usefixtures("docker_client")
@pytest.mark.parametrize("who", ["root", "user"])
def test_the_readme_first_five_commands_work_as_root_and_as_a_normal_user(who: str) -> None:
    """Before: as root in a root-owned checkout the first plan exited 6 ("the project root
    is owned by root … fix: chown -R 1000:1000 …", which hands the checkout to whoever is
    uid 1000). Now the five commands run as written, each exits 0, and the checkout stays
    its owner's: the run writes in a new folder owned by an unprivileged account."""
    if who == "root" and os.geteuid() != 0:
        pytest.skip("the root quickstart needs root")
    user = who == "user"
    # Outside pytest's own temporary folders: those are closed to other users.
    home = Path(tempfile.mkdtemp(prefix="kagura-readme-"))
    try:
        checkout = home / "kagura-agent"
        checkout.mkdir()
        _fresh_checkout(checkout)
        _locked_packages(checkout / ".venv")
        if user and os.geteuid() == 0:
            for path in (home, *home.rglob("*")):
                os.lchown(path, USER_UID, USER_UID)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("KAGURA", "XDG_", "PYTHON", "VIRTUAL_ENV"))
        }
        # The machine's system python3, as a fresh machine has it, and a home of one's own.
        env |= {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "NO_COLOR": "1"}
        env |= {"PIP_NO_CACHE_DIR": "1", "PIP_NO_INDEX": "1"}
        script = "set -e\n" + "".join(
            f"echo '=== {i}'\n{command}\n" for i, command in enumerate(FIRST_COMMANDS, 1)
        )
        argv = ["bash", "-c", script]
        done = subprocess.run(
            _as_user(argv) if user and os.geteuid() == 0 else argv,
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        said = f"{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, said[-6000:]
        assert "=== 5" in done.stdout
        project = checkout / "hello"
        owner = project.stat()
        if who == "root":
            from kagura_agent.membrane.account import AGENT_ACCOUNT, agent_account_uid

            assert owner.st_uid == agent_account_uid() != 0
            assert f"owned by {AGENT_ACCOUNT}, uid {owner.st_uid}" in done.stdout
        else:
            assert owner.st_uid == (USER_UID if os.geteuid() == 0 else os.geteuid())
        assert "applyable    yes" in done.stdout
        assert "succeeded" in done.stderr, said[-4000:]
        written = (project / "hello.txt").read_text()
        assert written == f"hello from uid {owner.st_uid} in /workspace\n"
        assert (project / "hello.txt").stat().st_uid == owner.st_uid
        # Nothing of the checkout changed hands: only the new project is the agent's.
        top = checkout.stat().st_uid
        for path in checkout.rglob("*"):
            if project in path.parents or path == project or ".venv" in path.parts:
                continue
            assert path.lstat().st_uid == top, path
    finally:
        shutil.rmtree(home, ignore_errors=True)
