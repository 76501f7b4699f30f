"""``kagura-agent completion SHELL``: generated from the real parser; bash completes for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kagura_agent.cli.main import COMMAND_MODULES, main

ROOT = Path(__file__).resolve().parents[1]


def _script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def _bash_complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers for the last word of ``words`` (as if TAB was pressed there)."""
    line = " ".join(words)
    driver = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\nCOMP_LINE={line!r}\nCOMP_POINT={len(line)}\n"
        "_shtab_kagura_agent kagura-agent\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_bash_completes_commands_subcommands_and_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "kagura-agent.bash"
    script.write_text(_script("bash", capsys))
    assert set(_bash_complete(script, ["kagura-agent", ""])) >= set(COMMAND_MODULES)
    assert _bash_complete(script, ["kagura-agent", "pl"]) == ["plan"]
    assert "list" in _bash_complete(script, ["kagura-agent", "images", ""])
    assert "--detailed-exitcode" in _bash_complete(script, ["kagura-agent", "plan", "--d"])
    assert _bash_complete(script, ["kagura-agent", "completion", "z"]) == ["zsh"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_every_command(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _script(shell, capsys)
    for command in COMMAND_MODULES:
        assert command in text
    assert "require-applyable" in text


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kagura_agent", "completion", "tcsh"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "invalid choice" in done.stderr
