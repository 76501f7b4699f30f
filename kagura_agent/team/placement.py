"""Placement: which queue a plan goes to, and which queues a runner may take from.

A plan needs one OCI runtime (``hardening.runtime``) and one tenancy
(``hardening.tenancy``); its queue is ``kagura.<tenancy>.<runtime>``. A runner advertises
the runtimes its Docker daemon really has and the tenancies it serves, and listens only to
the queues it can honour. Shared tenancy is honoured only with a microVM or gVisor
runtime (runsc, kata): a runner never listens to ``kagura.shared.runc``, whatever it says.
Pure functions over data; the daemon's runtimes are looked up by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kagura_agent.errors import UsageError
from kagura_agent.plan.model import Plan, Tenancy
from kagura_agent.plan.planner import SHARED_RUNTIMES

TENANCIES: tuple[Tenancy, ...] = ("self-host", "shared")


def queue_for(plan: Plan) -> str:
    """The queue a plan is placed on (its tenancy and runtime)."""
    return queue_name(plan["hardening"]["tenancy"], plan["hardening"]["runtime"])


def queue_name(tenancy: str, runtime: str) -> str:
    return f"kagura.{tenancy}.{runtime}"


@dataclass(frozen=True)
class Capacity:
    """What a runner advertises: how many runs at once, on which runtimes, for whom."""

    concurrency: int
    runtimes: tuple[str, ...]
    tenancies: tuple[Tenancy, ...]

    def queues(self) -> list[str]:
        """Every queue this runner can honour (shared tenancy: microVM/gVisor only)."""
        return [
            queue_name(tenancy, runtime)
            for tenancy in self.tenancies
            for runtime in self.runtimes
            if tenancy == "self-host" or runtime in SHARED_RUNTIMES
        ]


def capacity(
    concurrency: int,
    runtimes: Iterable[str],
    tenancies: Iterable[str],
    installed: Iterable[str],
) -> Capacity:
    """A runner's capacity, checked against the runtimes its daemon has (``installed``).

    Every error at once: a runtime the daemon lacks, an unknown tenancy, shared tenancy
    without a runtime that can isolate it, a concurrency below one.
    """
    have = set(installed)
    wanted = tuple(dict.fromkeys(runtimes)) or ("runc",)
    kinds = tuple(dict.fromkeys(tenancies)) or ("self-host",)
    problems = []
    if concurrency < 1:
        problems.append(f"concurrency must be at least 1 (got {concurrency})")
    missing = [r for r in wanted if r not in have]
    if missing:
        problems.append(
            f"runtime(s) {', '.join(missing)} not installed in this Docker daemon"
            f" (it has: {', '.join(sorted(have)) or 'none'})"
        )
    unknown = [t for t in kinds if t not in TENANCIES]
    if unknown:
        problems.append(f"unknown tenancy {', '.join(unknown)} (self-host or shared)")
    if "shared" in kinds and not any(r in SHARED_RUNTIMES for r in wanted):
        problems.append("shared tenancy needs a runsc or kata runtime on this runner")
    if problems:
        raise UsageError("this runner cannot advertise that capacity: " + "; ".join(problems))
    checked: tuple[Tenancy, ...] = tuple(t for t in TENANCIES if t in kinds)
    return Capacity(concurrency, wanted, checked)
