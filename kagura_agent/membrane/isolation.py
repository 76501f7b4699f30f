"""Isolation profiles: what a tenancy requires of the container runtime and the daemon.

``self-host`` (the default) runs the operator's own agent on the operator's machine:
runc with the hardening floor is accepted. ``shared`` means tenants that do not trust
each other share the host, so a kernel escape must not be one syscall away: only a
gVisor (runsc) or Kata microVM runtime is accepted.
"""

from __future__ import annotations

from typing import Any

from kagura_agent.errors import RefusedError
from kagura_agent.plan.model import Hardening

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
