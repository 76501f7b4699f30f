"""The sweeper: revoke what dead runs left behind, keep what it cannot revoke in view.

Runs at every start (apply, serve) and as ``kagura-agent leases sweep``. For every open
ledger row whose owner process is gone (or that an operator names):

    revocable provider   live row   → revoke the minted id            → closed "revoked"
                         intent row → find mints tagged with the row  → revoke each
    otherwise            past expiry → closed "expired";  before → left open, shown

Revoke failures are classified: transient ones (network, 429, 5xx, a secret not
resolvable right now) are retried with backoff inside the sweep and then scheduled for
a later sweep; poison ones (401/403, a broken scope) mark the row ``poison`` — kept open
and shown by ``leases list`` until an operator acts, never dropped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from kagura_agent.clock import Clock, SystemClock
from kagura_agent.errors import KaguraError, SetupError
from kagura_agent.membrane.endpoints import check_endpoints
from kagura_agent.membrane.leases.broker import ProviderFactory
from kagura_agent.membrane.leases.ledger import GrantRow, Ledger
from kagura_agent.membrane.providers import CredentialProvider, ProviderError, build_provider
from kagura_agent.membrane.secrets import Redactor, resolve
from kagura_agent.processes import owner_alive
from kagura_agent.state import StateStore

TRIES_PER_SWEEP = 3
BACKOFF_BASE = timedelta(seconds=30)
BACKOFF_MAX = timedelta(hours=1)


@dataclass
class SweepReport:
    revoked: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    retry_later: list[str] = field(default_factory=list)
    poison: list[str] = field(default_factory=list)
    lapsing: list[str] = field(default_factory=list)  # orphaned, not revocable, not expired
    held: list[str] = field(default_factory=list)  # owner still running

    def summary(self) -> str:
        parts = [
            f"{len(self.revoked)} revoked",
            f"{len(self.expired)} expired",
            f"{len(self.retry_later)} to retry",
            f"{len(self.poison)} poison",
            f"{len(self.lapsing)} lapsing",
            f"{len(self.held)} held by running processes",
        ]
        return ", ".join(parts)


class Sweeper:
    """Acts on orphaned ledger rows; see the module docstring."""

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Clock | None = None,
        provider_factory: ProviderFactory = build_provider,
        resolver: Callable[[str], str] = resolve,
        sleep: Callable[[float], None] = time.sleep,
        redactor: Redactor | None = None,
        backoff_seconds: float = 0.5,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.ledger = Ledger(store, self.clock)
        self._factory = provider_factory
        self._resolver = resolver
        self._sleep = sleep
        self._redactor = redactor or Redactor()
        self._backoff = backoff_seconds
        self._providers: dict[tuple[str, str, str], CredentialProvider] = {}

    def sweep(self, *, only: str | None = None, force: bool = False) -> SweepReport:
        """Sweep orphaned rows (or just row ``only``, even if its owner lives, when forced)."""
        report = SweepReport()
        now = self.clock.now()
        for row in self.ledger.open_rows():
            if only is not None and only not in (row.id, row.lease):
                continue
            if not force and owner_alive(row.owner_pid, row.owner_start, row.owner_host):
                report.held.append(row.id)
                continue
            if not force and row.state == "poison":
                report.poison.append(row.id)
                continue
            if not force and row.next_attempt_at and row.next_attempt_at > now:
                report.retry_later.append(row.id)
                continue
            self._sweep_row(row, report)
        return report

    def _sweep_row(self, row: GrantRow, report: SweepReport) -> None:
        now = self.clock.now()
        last: ProviderError | KaguraError | None = None
        for attempt in range(TRIES_PER_SWEEP):
            if attempt:
                self._sleep(self._backoff * 2 ** (attempt - 1))
            try:
                outcome = self._act(row)
            except ProviderError as exc:
                last = exc
                if not exc.transient:
                    break
                continue
            except SetupError as exc:  # secret unresolvable or SDK missing: may be fixed
                last = exc
                continue
            except KaguraError as exc:  # a broken scope: retrying cannot help
                last = exc
                break
            getattr(report, outcome).append(row.id)
            return
        assert last is not None
        message = self._redactor.scrub(str(last))
        transient = isinstance(last, SetupError) or (
            isinstance(last, ProviderError) and last.transient
        )
        delay = min(BACKOFF_MAX, BACKOFF_BASE * 2**row.attempts)
        self.ledger.record_failure(
            row.id,
            message,
            poison=not transient,
            next_attempt_at=now + delay if transient else None,
        )
        (report.retry_later if transient else report.poison).append(row.id)

    def _act(self, row: GrantRow) -> str:
        """Try once; return the report bucket, or raise a classified error."""
        now = self.clock.now()
        provider = self._provider(row)
        if not provider.revocable:
            horizon = row.expires_at or row.created_at + timedelta(seconds=row.ttl_seconds)
            if horizon <= now:
                self.ledger.close(row.id, "expired", note="orphan lapsed at its expiry")
                return "expired"
            return "lapsing"
        minted_ids = [row.minted_id] if row.minted_id else provider.find(row.id)
        for minted_id in minted_ids:
            try:
                provider.revoke(minted_id)
            except ProviderError as exc:
                if not exc.gone:
                    raise
        note = "revoked by sweep" if minted_ids else "never minted"
        self.ledger.close(row.id, "revoked" if minted_ids else "failed", note=note)
        return "revoked" if minted_ids else "expired"

    def _provider(self, row: GrantRow) -> CredentialProvider:
        key = (row.type, row.secret_ref, json.dumps(row.scope_spec, sort_keys=True))
        if key not in self._providers:
            # Only the endpoint recorded at mint time, and only where a root secret may go.
            check_endpoints(row.scope_spec)
            secret = self._resolver(row.secret_ref)
            self._redactor.add(secret)
            self._providers[key] = self._factory(row.type, dict(row.scope_spec), secret)
        return self._providers[key]


def sweep(
    store: StateStore,
    provider_factory: ProviderFactory = build_provider,
    *,
    clock: Clock | None = None,
    resolver: Callable[[str], str] = resolve,
    sleep: Callable[[float], None] = time.sleep,
) -> SweepReport:
    """Sweep every orphaned lease once (call at every start)."""
    sweeper = Sweeper(
        store, clock=clock, provider_factory=provider_factory, resolver=resolver, sleep=sleep
    )
    return sweeper.sweep()
