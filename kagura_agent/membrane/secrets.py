"""Secret references, their resolution, inline-secret detection and redaction.

Manifests and plans carry only *references* to root secrets:

    env:NAME               an environment variable of the applying process
    file:PATH              a file on the host (absolute or ~-relative), trailing newline dropped;
                           inside a Policy's secret_dirs (checked by validate), a regular
                           file of the applying user outside /proc, /sys, /dev (checked here)
    keyring:SERVICE/USER   the OS keychain through the optional ``keyring`` package

``parse_secret_ref`` is pure (the planner validates with it); ``resolve`` reads the value
and is called only by ``apply`` and the lease sweeper. ``looks_like_secret`` (from
kagura_agent.hygiene) spots key material pasted inline. ``Redactor`` scrubs every value
it was told about from text headed for logs, events or error messages.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any, Literal

from kagura_agent.errors import SetupError
from kagura_agent.hygiene import looks_like_secret as looks_like_secret  # re-exported
from kagura_agent.paths import under

SecretKind = Literal["env", "file", "keyring"]
REDACTED = "(sensitive)"
# A file: secret never comes from these (resolved paths): the applying process's own
# environment and memory, kernel state, devices.
FORBIDDEN_SECRET_ROOTS = ("/proc", "/sys", "/dev")
MAX_SECRET_FILE_BYTES = 64 * 1024

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SecretRef:
    """A parsed reference; ``str()`` gives back the canonical text form."""

    kind: SecretKind
    target: str  # env var name, file path, or "SERVICE/USER"

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"


def parse_secret_ref(text: str) -> SecretRef | str:
    """Parse ``text`` as a secret reference; return an error message if it is not one.

    The message never echoes ``text`` itself: a value that is not a reference may well
    be the secret pasted inline.
    """
    kind, sep, target = text.partition(":")
    if not sep or kind not in ("env", "file", "keyring"):
        return (
            "not a secret reference: expected env:NAME, file:PATH or keyring:SERVICE/USER"
            " (inline secret values are not allowed)"
        )
    if kind == "env":
        if not _ENV_NAME.match(target):
            return "env: reference needs an environment variable name like env:AWS_ROOT_KEY"
        return SecretRef("env", target)
    if kind == "file":
        if not target or "\x00" in target:
            return "file: reference needs a path like file:~/.config/kagura/cf-token"
        if not (target.startswith("/") or target.startswith("~")):
            return "file: reference must be an absolute path or start with ~"
        return SecretRef("file", target)
    service, slash, user = target.partition("/")
    if not slash or not service or not user:
        return "keyring: reference needs SERVICE/USER like keyring:kagura/cloudflare"
    return SecretRef("keyring", target)


def resolve(ref: SecretRef | str) -> str:
    """Read the secret value a reference names. Raises SetupError naming the reference only."""
    if isinstance(ref, str):
        parsed = parse_secret_ref(ref)
        if isinstance(parsed, str):
            raise SetupError(parsed)
        ref = parsed
    if ref.kind == "env":
        value = os.environ.get(ref.target)
        if not value:
            raise SetupError(
                f"secret {ref} is not set",
                hint=f"export {ref.target}=… in the shell that runs apply, or use file:/keyring:",
            )
        return value
    if ref.kind == "file":
        value = _read_secret_file(ref).rstrip("\r\n")
        if not value:
            raise SetupError(f"secret {ref} is empty")
        return value
    return _resolve_keyring(ref)


def _read_secret_file(ref: SecretRef) -> str:
    """The file's text — only a regular file of the applying user, outside /proc, /sys, /dev.

    Symlinks are resolved first, so a link into /proc or to another user's file is refused
    like the target itself; the resolved file is opened without following links again.
    """
    real = os.path.realpath(os.path.expanduser(ref.target))
    if any(under(real, root) for root in FORBIDDEN_SECRET_ROOTS):
        raise SetupError(f"secret {ref} refused: {real} is never a secret file")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise SetupError(f"secret {ref} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SetupError(f"secret {ref} refused: not a regular file")
        if info.st_uid != os.geteuid():
            raise SetupError(f"secret {ref} refused: the file belongs to another user")
        data = b""
        while len(data) <= MAX_SECRET_FILE_BYTES:
            chunk = os.read(fd, MAX_SECRET_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise SetupError(f"secret {ref} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise SetupError(f"secret {ref} refused: larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SetupError(f"secret {ref} is not UTF-8 text") from None


def _resolve_keyring(ref: SecretRef) -> str:
    alternatives = "use env:NAME or file:PATH instead"
    try:
        import keyring
        import keyring.errors
    except ImportError:
        raise SetupError(
            f"secret {ref} needs the keyring package, which is not installed",
            hint=f"pip install 'kagura-agent[keyring]', or {alternatives}",
        ) from None
    service, _, user = ref.target.partition("/")
    backend = keyring.get_keyring()
    if _backend_unusable(backend):
        raise SetupError(
            f"secret {ref}: no usable keyring backend ({type(backend).__name__})",
            hint=f"install and configure a backend (e.g. keyrings.alt), or {alternatives}",
        )
    try:
        value = keyring.get_password(service, user)
    except keyring.errors.KeyringError as exc:
        raise SetupError(
            f"secret {ref}: keyring backend failed ({type(exc).__name__})",
            hint=alternatives,
        ) from None
    if not value:
        raise SetupError(f"secret {ref} is not in the keyring ({type(backend).__name__})")
    return str(value)


def _backend_unusable(backend: object) -> bool:
    # keyring's "fail" backend and a zero-priority chainer both mean nothing can store secrets.
    name = type(backend).__module__ + "." + type(backend).__name__
    if name.endswith("fail.Keyring"):
        return True
    priority = getattr(backend, "priority", 1)
    try:
        return float(priority) <= 0 and not getattr(backend, "backends", None)
    except (TypeError, ValueError):
        return False


class Redactor:
    """Knows every resolved secret and minted value; scrubs them from any text.

    Thread-safe: the lease keeper adds renewed values while the event stream scrubs.
    Values shorter than 6 characters are not registered (they would shred ordinary text);
    no real secret or token is that short.

    A value is registered in every form a tool's output or our own output may carry it
    (see :func:`_forms`): each line; for a JSON document (a service-account key) every
    string in it, decoded (``jq -r .private_key`` prints the PEM with real newlines); and
    each of those as it reads inside a JSON string (``apply --json`` scrubs its encoded
    line, where quotes, backslashes and newlines are escaped).
    """

    MIN_LENGTH = 6

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._pattern: re.Pattern[str] | None = None
        self._folded: re.Pattern[str] | None = None

    def add(self, *values: str) -> None:
        """Register values to scrub (and, for multi-line values, each of their lines)."""
        with self._lock:
            for value in values:
                for part in _forms(value):
                    if len(part) >= self.MIN_LENGTH:
                        self._values.add(part)
            self._pattern = self._folded = None

    def scrub(self, text: str) -> str:
        """Return ``text`` with every known value replaced by ``(sensitive)``."""
        with self._lock:
            if not self._values:
                return text
            if self._pattern is None:
                # Longest first so a value containing another is replaced whole.
                ordered = sorted(self._values, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
            pattern = self._pattern
        return pattern.sub(REDACTED, text)

    def scrub_any_case(self, text: str) -> str:
        """``scrub``, matching each known value in any case: for text that passed through
        something that folds case (a host name a proxy logged)."""
        with self._lock:
            if not self._values:
                return text
            if self._folded is None:
                ordered = sorted(self._values, key=len, reverse=True)
                self._folded = re.compile("|".join(re.escape(v) for v in ordered), re.IGNORECASE)
            pattern = self._folded
        return pattern.sub(REDACTED, text)

    def scrub_data(self, value: Any) -> Any:
        """``value`` (JSON-shaped data) with every string in it scrubbed, keys too."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub(str(k)): self.scrub_data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_data(item) for item in value]
        return value

    def __repr__(self) -> str:
        return f"Redactor({len(self._values)} values)"


def _forms(value: str) -> set[str]:
    """``value``, each of its lines and every string of it as a JSON document, each
    stripped, also as it reads JSON-escaped (ASCII-only and not)."""
    plain = [value, *value.splitlines()]
    if value.lstrip()[:1] in ("{", "["):
        try:
            document = json.loads(value)
        except ValueError:
            document = None
        for text in _strings(document):
            plain += [t for t in (text, *text.splitlines()) if _secretish(t.strip())]
    forms = set()
    for part in (p.strip() for p in plain):
        forms.add(part)
        forms.add(json.dumps(part, ensure_ascii=False)[1:-1])
        forms.add(json.dumps(part)[1:-1])
    return forms


# What a JSON secret holds besides its secrets (a service-account key's type, e-mail, URLs,
# universe domain, PEM armour): registered, they would shred ordinary output.
_PUBLIC = re.compile(
    r"[a-z_.-]+"  # a plain word or domain, no digit: service_account, googleapis.com
    r"|[^@\s]+@[^@\s]+"  # an e-mail address
    r"|[a-z][a-z0-9+.-]*://\S+"  # a URL
    r"|-----(?:BEGIN|END) [A-Z0-9 ]+-----"  # PEM armour
)


def _secretish(text: str) -> bool:
    """A string of a JSON secret worth scrubbing when printed on its own."""
    return not _PUBLIC.fullmatch(text)


def _strings(document: object) -> list[str]:
    if isinstance(document, str):
        return [document]
    if isinstance(document, dict):
        return [t for v in document.values() for t in _strings(v)]  # keys are no secret
    if isinstance(document, list):
        return [t for item in document for t in _strings(item)]
    return []
