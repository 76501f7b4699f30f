"""Key material in a manifest or task file (manifest/secretscan.py): what is found, how it
is reported, and what is not — the examples docs/authority.md shows, each run here."""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.manifest.secretscan import normalise, scan, scan_joined

ROOT = Path(__file__).resolve().parent.parent
HEAD = "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: scan}\nspec:\n  steps: [ls]\n"
KEY = "sk-ant-api03-" + "a1B2" * 10
SECTION = "### Key material in a manifest or task file"


def _documented() -> list[tuple[str, str]]:
    """(the outcome a docs example states, the example's text)."""
    text = (ROOT / "docs" / "authority.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```text\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) >= 10, "docs/authority.md lost its secret-check examples"
    return [(block.splitlines()[0], block) for block in blocks]


def _validate(tmp_path: Path, body: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    (tmp_path / "p").mkdir()
    task = tmp_path / "p" / "task.yml"
    task.write_text(HEAD + body.replace("{ZWSP}", "\u200b"), encoding="utf-8")
    code = main(["validate", str(task)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("outcome", "body"), _documented(), ids=lambda v: v[:60])
def test_each_documented_example_is_what_the_docs_say(
    outcome: str,
    body: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    code, err = _validate(tmp_path, body, capsys)
    if outcome.startswith("# caught: "):
        what = outcome.removeprefix("# caught: ")
        assert code == 2, err
        [line] = [ln for ln in err.splitlines() if "inline secret" in ln]
        assert f"inline secret ({what}" in line, err
        assert re.match(r"\S*task\.yml:\d+:\d+  \$", line), line
    else:
        assert outcome.startswith("# not caught: ")
        assert code == 0, err


@pytest.mark.parametrize(
    ("text", "how"),
    [
        (KEY, ""),
        (KEY[:10] + "\u200b\u200d" + KEY[10:], "hidden"),
        (KEY[:5] + "\u00ad" + KEY[5:], "hidden"),  # a soft hyphen
        (KEY[:5] + "\U000e0041" + KEY[5:], "hidden"),  # a Unicode tag character
        (KEY[:5] + "\ufe0f" + KEY[5:], "hidden"),  # a variation selector
        ("".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in KEY), "hidden"),
        (base64.b64encode(KEY.encode()).decode(), "base64-encoded"),
        (base64.urlsafe_b64encode(KEY.encode()).decode().rstrip("="), "base64-encoded"),
        (
            base64.b64encode(base64.b64encode(KEY.encode())).decode(),
            "base64-encoded, base64-encoded",
        ),
        (KEY.encode().hex(), "hex-encoded"),
        ("".join(f"%{ord(c):02x}" for c in KEY), "percent-encoded"),
    ],
)
def test_a_key_is_found_however_it_is_dressed(text: str, how: str) -> None:
    [found] = scan(f"x: {text} y")
    assert found.kind == "an Anthropic API key" and found.how.startswith(how)
    assert found.offset == 3 and found.secret == KEY


def test_a_third_layer_of_encoding_is_not_opened() -> None:
    thrice = KEY.encode()
    for _ in range(3):
        thrice = base64.b64encode(thrice)
    assert scan(thrice.decode()) == []


@pytest.mark.parametrize(
    "text",
    [
        f'steps:\n  - "{KEY[:15]}"\n  - "{KEY[15:]}"\n',
        f'steps: ["{KEY[:20]}", "{KEY[20:]}"]\n',
        f"k: {KEY[:20]}\\\n   {KEY[20:]}\n",
        f"# {KEY[:25]}\n# {KEY[25:]}\n",
    ],
)
def test_a_key_broken_across_lines_or_items_is_found(text: str) -> None:
    found = scan_joined(text, set())
    assert [(f.kind, f.secret) for f in found] == [("an Anthropic API key", KEY)]
    assert "split across lines" in found[0].how and text[found[0].offset :].startswith("sk-")


@pytest.mark.parametrize(
    "text",
    [
        "sk-learn-tools",
        "pip install task-runner-plugin",
        "ASIAPACIFICREGIONDATA",
        "sha256:" + "ab12" * 16,
        "0123456789abcdef0123456789abcdef01234567",
        "c29tZSBwbGFpbiB0ZXh0IHRoYXQgaXMgZmluZQ==",  # base64 of plain text
        "%E2%9C%93 done",
        "api.github.com, env:GITHUB_TOKEN",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scan(text) == [] and scan_joined(text + "\n" + text, set()) == []


def test_invisible_characters_are_removed_and_offsets_kept() -> None:
    clean, where = normalise("a\u200bb\uff43\u00add")
    assert clean == "abcd"
    assert [where[i] for i in range(4)] == [0, 2, 3, 5]


def test_every_packaged_manifest_and_example_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    for folder in ("manifests", "examples", "tests/plans"):
        for file in sorted((ROOT / folder).rglob("*.y*ml")):
            text = file.read_text(encoding="utf-8")
            assert scan(text) == [] and scan_joined(text, set()) == [], file


@pytest.mark.parametrize(
    "text",
    [
        "[" * 500_000 + "]" * 500_000,
        "A" * 1_000_000,
        "ab" * 500_000,
        "%41" * 330_000,
        ("x " * 10 + "b%41c ") * 40_000,
        "'\n- " * 250_000,
        "sk-ant-" * 140_000,
        (KEY + " ") * 18_000,
        "\u200b" * 300_000,
        ("é" + "a" * 5) * 160_000,
    ],
    ids=lambda t: repr(t[:12]),
)
def test_a_megabyte_of_the_worst_is_scanned_in_linear_time(text: str) -> None:
    """The bound every input has (5 s) on the loader's largest file: a linear scan takes
    about a second of CPU; a quadratic one would take hours (the first percent-decoding
    did, on a 200 kB line without a %)."""
    start = time.process_time()
    scan(text)
    scan_joined(text, set())
    assert time.process_time() - start < 5.0
