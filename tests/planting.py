"""Shadowing modules planted where an agent writes, each leaving a marker when imported.

``kagura_agent/__init__.py``, standard library names (``json``, ``socket``, ``asyncio``,
``uuid``), dependency names (``yaml``, ``publicsuffixlist``, ``docker``, ``pip``,
``claude_agent_sdk``), ``sitecustomize``, ``usercustomize`` and a ``.pth``: importing one
creates ``MARKS/TAG--NAME`` (MARKS is a folder of the host, or of the container; where it
does not exist the module does nothing).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

PLANTED = (
    "kagura_agent/__init__.py",
    "json.py",
    "socket.py",
    "asyncio/__init__.py",
    "uuid.py",
    "yaml.py",
    "publicsuffixlist.py",
    "docker/__init__.py",
    "pip/__init__.py",
    "claude_agent_sdk/__init__.py",
    "sitecustomize.py",
    "usercustomize.py",
    "zz-planted.pth",
)


def module_code(mark: str) -> str:
    """A module that creates the file ``mark`` when imported (nothing where it cannot)."""
    return (
        "import os\n"
        "try:\n"
        f"    os.close(os.open({mark!r}, os.O_CREAT | os.O_WRONLY, 0o666))\n"
        "except OSError:\n"
        "    pass\n"
    )


def planted_files(marks: str | Path, tag: str) -> dict[str, str]:
    """Each planted file's text; importing it leaves ``marks/TAG--NAME``."""
    files = {}
    for rel in PLANTED:
        code = module_code(os.path.join(str(marks), f"{tag}--{rel.replace('/', '.')}"))
        if rel.endswith(".pth"):  # a .pth line starting with import is run by site
            code = "import os; exec(" + repr(code) + ")\n"
        files[rel] = code
    return files


def plant(folder: Path, marks: Path, tag: str, uid: int | None = None) -> None:
    """The planted files in ``folder`` (owned by ``uid`` when given)."""
    for rel, code in planted_files(marks, tag).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
        if uid is not None:
            os.chown(path.parent, uid, uid)
            os.chown(path, uid, uid)


def planting_step(marks: str | Path, tag: str) -> str:
    """A shell step writing the planted files into its working directory."""
    return writing_step(planted_files(marks, tag))


def writing_step(files: dict[str, str]) -> str:
    """A shell step writing ``files`` (relative path: text) into its working directory."""
    lines = []
    for rel, code in files.items():
        folder = os.path.dirname(rel)
        encoded = base64.b64encode(code.encode()).decode()
        if folder:
            lines.append(f"mkdir -p {folder}")
        lines.append(f"echo {encoded} | base64 -d > {rel}")
    return " && ".join(lines)


def marks_left(marks: Path) -> list[str]:
    """The markers in ``marks``: every planted module something imported."""
    return sorted(p.name for p in marks.iterdir()) if marks.is_dir() else []
