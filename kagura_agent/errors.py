"""The project's error tree and its exit codes, in one place.

    KaguraError                     exit code on the class; printed without a traceback
    ├── UsageError (2)              bad command line, empty task, unreadable file
    ├── ValidationError (2)         manifests or task invalid; carries every Diagnostic
    ├── SetupError (3)              something the run needs is not ready (memory, docker, extra)
    ├── DoctorFailed (4)            doctor found failing checks
    ├── RefusedError (6)            stale plan, approval denied, policy denied, budget exhausted
    └── TaskFailed (1)              the task ran and its verify commands failed

Library errors (docker, botocore, httpx, slack) are translated into these at the
adapter that calls the library; nothing above an adapter sees a library exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kagura_agent.hygiene import neutralise, redact_secrets

# A message quoting a value longer than this is cut: a 1 MiB scalar in the wrong place
# must not become a 1 MiB error line.
MAX_MESSAGE = 1000


def _clean(text: str, limit: int | None = None) -> str:
    text = neutralise(redact_secrets(text), newlines=False)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


class ExitCode(IntEnum):
    OK = 0
    TASK_FAILED = 1
    USAGE = 2
    SETUP = 3
    DOCTOR = 4
    CHANGES = 5
    REFUSED = 6


@dataclass(frozen=True)
class Diagnostic:
    """One located problem in a manifest or task file."""

    file: str
    line: int
    col: int
    path: str
    message: str
    hint: str = ""
    severity: str = "error"

    def __post_init__(self) -> None:
        # Every field may quote an input (a file name, a key, a value): shown on one line,
        # controls escaped, key material redacted, long quotes cut.
        for name in ("file", "path", "hint"):
            object.__setattr__(self, name, _clean(getattr(self, name)))
        object.__setattr__(self, "message", _clean(self.message, MAX_MESSAGE))

    def render(self) -> str:
        text = f"{self.file}:{self.line}:{self.col}  {self.path}  {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity,
        }


class KaguraError(Exception):
    """Base of every error a user can cause or fix; printed as a message, not a traceback."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        text = f"error: {neutralise(redact_secrets(self.message))}"
        if self.hint:
            text += f"\n  hint: {neutralise(redact_secrets(self.hint))}"
        return text

    def diagnostics_json(self) -> list[dict[str, object]]:
        """The error as ``--json`` prints it: located diagnostics, or one unlocated entry."""
        return [
            {
                "file": None,
                "line": None,
                "col": None,
                "path": None,
                "message": self.message,
                "hint": self.hint,
                "severity": "error",
            }
        ]


class UsageError(KaguraError):
    exit_code = ExitCode.USAGE


class ValidationError(KaguraError):
    exit_code = ExitCode.USAGE

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        count = len(diagnostics)
        super().__init__(f"{count} validation error{'s' if count != 1 else ''}")
        self.diagnostics = diagnostics

    def render(self) -> str:
        lines = [d.render() for d in self.diagnostics]
        lines.append(f"error: {self.message}")
        return "\n".join(lines)

    def diagnostics_json(self) -> list[dict[str, object]]:
        return [d.to_json() for d in self.diagnostics]


class SetupError(KaguraError):
    exit_code = ExitCode.SETUP


class DoctorFailed(KaguraError):
    exit_code = ExitCode.DOCTOR


class RefusedError(KaguraError):
    exit_code = ExitCode.REFUSED


class TaskFailed(KaguraError):
    exit_code = ExitCode.TASK_FAILED


class Terminated(BaseException):
    """SIGTERM, raised by apply's signal handler so it takes the same clean-up path as
    Ctrl-C; the CLI exits 143 for it wherever it surfaces."""
