"""What one run asks of its egress proxy, as one value.

    request = EgressRequest.for_run(plan, run_id, injection=..., injection_secret=..., scrub=...)
    with EgressSession.start(client, request, on_event, store=store, clock=clock) as egress:
        ...

apply builds it once from the plan (:meth:`EgressRequest.for_run`), a test or benchmark
from its own plan and the reach it needs; :meth:`EgressSession.start` takes it whole, and
no layer on the way copies its fields. It is frozen: a variation (a fake upstream's port,
a test network) is ``dataclasses.replace(request, ...)``, and a new fact is a new field
with a default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kagura_agent.membrane.egress.audit import EVENT_CEILING, LOG_CEILING
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.plan.model import Plan


@dataclass(frozen=True)
class EgressRequest:
    """What a run asks of its egress proxy: which run, under which plan, with what."""

    # The plan the proxy enforces: its egress section (allowlist, pinned proxy image,
    # model-call policy, pool knob) and its turn budget (the injected port's call caps).
    plan: Plan
    run_id: str
    # The key-injecting reverse proxy (modelport.py) and the credential it adds upstream:
    # both or neither. The secret is never shown (repr) with the request.
    injection: Injection | None = None
    injection_secret: str | None = field(default=None, repr=False)
    # The run's redactor, applied to every decision before it is stored or emitted: the
    # agent chooses a request's host and path, and may put its credentials there.
    scrub: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    # Claim an idle pooled session (pool.py) when there is one (a cold start otherwise).
    from_pool: bool = False
    # What the agent may make the host keep (audit.py): past log_ceiling bytes of the
    # proxy's log the run is stopped, past event_ceiling decisions they are counted only.
    log_ceiling: int = LOG_CEILING
    event_ceiling: int = EVENT_CEILING
    # False: the caller has just swept egress orphans (apply does, before its run row).
    sweep: bool = True
    # The proxy image instead of the plan's pinned one (tests, benchmarks).
    image: str | None = None
    # Networks the proxy alone joins before squid starts: a local model endpoint's
    # (membrane/egress/local.py), or where a test's upstreams live.
    extra_networks: tuple[str, ...] = ()
    # Reach for tests: names written to the proxy's /etc/hosts (name -> address), so they
    # resolve to addresses no test may really reach. A request with extra hosts or
    # networks starts cold.
    extra_hosts: Mapping[str, str] = field(default_factory=dict)
    # How long the proxy has to listen before the start is a SetupError.
    ready_timeout: float = 60.0

    @classmethod
    def for_run(
        cls,
        plan: Plan,
        run_id: str,
        *,
        injection: Injection | None = None,
        injection_secret: str | None = None,
        scrub: Callable[[str], str] | None = None,
        extra_networks: tuple[str, ...] = (),
    ) -> EgressRequest:
        """apply's request: the operator's pool knob (Policy spec.egress_pool) and the log
        tripwire as the plan shows them; apply swept orphans at the start of the run."""
        return cls(
            plan,
            run_id,
            injection=injection,
            injection_secret=injection_secret,
            scrub=scrub,
            extra_networks=extra_networks,
            from_pool=bool(plan["egress"].get("pool", False)),
            log_ceiling=plan["tripwires"]["egress_log_bytes"],
            sweep=False,
        )

    @property
    def cold_only(self) -> bool:
        """A run with a credential injection or test reach never takes a pooled session."""
        return self.injection is not None or bool(self.extra_networks or self.extra_hosts)
