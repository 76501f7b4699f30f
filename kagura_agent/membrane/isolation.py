"""Isolation profiles: what a tenancy requires of the container runtime and the daemon.

``self-host`` (the default) runs the operator's own agent on the operator's machine:
runc with the hardening floor is accepted. ``shared`` means tenants that do not trust
each other share the host, so a kernel escape must not be one syscall away: only a
gVisor (runsc) or Kata microVM runtime is accepted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kagura_agent.errors import RefusedError
from kagura_agent.plan.model import Hardening, Refusal

SANDBOX_RUNTIMES = frozenset(
    {"runsc", "gvisor", "kata", "kata-runtime", "kata-qemu", "kata-fc", "io.containerd.kata.v2"}
)


def check_tenancy(hardening: Hardening) -> None:
    """Refuse a ``shared`` tenancy unless the plan's runtime is runsc or kata (exit 6)."""
    tenancy = hardening.get("tenancy", "self-host")
    runtime = hardening.get("runtime", "runc")
    if tenancy == "shared" and runtime not in SANDBOX_RUNTIMES:
        raise RefusedError(
            f"tenancy 'shared' needs a gVisor or Kata runtime, but the plan uses {runtime!r}",
            hint="install runsc or kata-runtime, register it with dockerd and set the"
            " image manifest's runtime",
        )


SHARED_UID_WARNING = (
    "the Docker daemon uses neither userns-remap nor rootless mode:"
    " the container's uid is the same uid on the host"
)
_REQUIRED_HINT = (
    'run dockerd with userns-remap ("userns-remap": "default" in daemon.json) or'
    " rootless, or drop user_namespaces: required from the Policy"
)


def user_namespaces_required(policies: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any Policy's spec says ``user_namespaces: required`` (a requirement only
    tightens, so every layer's counts)."""
    return any(spec.get("user_namespaces") == "required" for spec in policies)


def isolated(daemon: Mapping[str, Any] | None) -> bool:
    """A container's uid is not the host's: the daemon remaps user namespaces or is rootless."""
    return daemon is not None and bool(daemon.get("userns_remap") or daemon.get("rootless"))


def user_namespace_refusals(
    required: bool, runtime: str, daemon: Mapping[str, Any] | None
) -> list[Refusal]:
    """The plan's refusal when a Policy requires user namespaces and this plan does not
    have them: a daemon with neither, one that did not answer, or the brain on the host."""
    if not required or isolated(daemon):
        return []
    if runtime == "host":
        why = "the brain runs on the host, as the operator's own uid"
    elif daemon is None:
        why = "the Docker daemon did not say whether it does (no answer to docker info)"
    else:
        why = SHARED_UID_WARNING.replace("the container's uid", "a container's uid")
    return [
        {
            "code": "userns-required",
            "message": f"a Policy requires user namespaces (user_namespaces: required), but {why}",
            "source": "$.inputs.facts.daemon",
        }
    ]


def notice_once(
    daemon: Mapping[str, Any] | None, info: Mapping[str, Any] | None, seen: Path
) -> str | None:
    """The shared-uid warning, the first time a daemon without user namespaces is seen.

    ``daemon`` is a plan's ``inputs.facts.daemon``; ``info`` is this daemon's ``docker
    info`` (its ID keys the note, so another daemon is told again); ``seen`` is the
    folder of daemons already told. None: nothing to say (isolated, unknown, or told).
    """
    if daemon is None or isolated(daemon) or info is None or isolated(isolation_report(dict(info))):
        return None
    ident = str(info.get("ID") or info.get("Name") or "")
    if not ident:
        return None
    marker = seen / hashlib.sha256(ident.encode()).hexdigest()[:24]
    if marker.exists():
        return None
    try:
        seen.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(info.get("ServerVersion") or "") + "\n", encoding="utf-8")
    except OSError:
        pass  # said again next time: better than never
    return (
        f"{SHARED_UID_WARNING} (said once for this daemon; `kagura-agent doctor` says it"
        " every time; a Policy can require it: user_namespaces: required)"
    )


def isolation_report(info: dict[str, Any]) -> dict[str, Any]:
    """Summarize ``docker info`` for doctor and plan: userns-remap, rootless, runtimes.

    Pure: takes the dict ``client.info()`` returns.
    """
    options = [str(o) for o in info.get("SecurityOptions") or []]
    names = {o.split(",")[0].removeprefix("name=") for o in options}
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    report: dict[str, Any] = {
        "userns_remap": "userns" in names,
        "rootless": "rootless" in names,
        "seccomp": "seccomp" in names,
        "security_options": options,
        "runtimes": runtimes,
        "default_runtime": info.get("DefaultRuntime", ""),
        "sandbox_runtimes": [r for r in runtimes if r in SANDBOX_RUNTIMES],
        "warnings": [],
    }
    if not (report["userns_remap"] or report["rootless"]):
        report["warnings"].append(
            "the Docker daemon runs without userns-remap or rootless mode: uid 1000 in a"
            " container is uid 1000 on the host"
        )
    if not report["seccomp"]:
        report["warnings"].append("the Docker daemon reports no seccomp support")
    return report
