"""The broker: mints short-lived leases inside an approved budget, default deny.

    broker = Broker(store, run_id="run-…")
    lease = broker.acquire(LeaseRequest.from_plan(entry))   # ledger intent → mint → live
    lease.bundle                                            # deliver into the container
    lease.tick()        # heartbeat; renews when due; RefusedError when the budget is spent
    lease.release()     # revoke (where the provider can) and close the row

A lease lasts 15 minutes to 1 hour (less when its budget is shorter) and is renewed (a
fresh mint, then the old one is revoked) a while before its credential expires: 5 minutes,
or a third of a shorter credential's life. The last credential its budget allows (no
renewal left, or too little of the budget after it for the provider to mint) is held to
its end — it is the budget, not the renewal margin, that ends a lease — and
``FINAL_MARGIN`` before that end the lease fails closed: the current credential is wiped
and revoked and RefusedError (exit 6) is raised — never an expired or a wider
credential. ``held_until`` says when that will be, so the run can ask an operator to
extend the budget first (apply/midrun/grants.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn

from kagura_agent.clock import Clock, SystemClock, iso
from kagura_agent.errors import KaguraError, RefusedError, SetupError
from kagura_agent.membrane.endpoints import check_endpoints
from kagura_agent.membrane.leases.ledger import Ledger, Owner, new_id
from kagura_agent.membrane.lifetimes import first_lease_seconds
from kagura_agent.membrane.providers import (
    Bundle,
    CredentialProvider,
    Minted,
    ProviderError,
    build_provider,
)
from kagura_agent.membrane.providers.traits import traits_of
from kagura_agent.membrane.secrets import Redactor, resolve
from kagura_agent.state import StateStore

RENEW_MARGIN = timedelta(minutes=5)
# The last credential of a budget is wiped this long before it ends: the keeper polls
# every few seconds, and the container must never hold it past its budget.
FINAL_MARGIN = timedelta(seconds=10)
# How far past the budget's end a provider's expiry may lie (its clock against ours).
OUTLIVE_TOLERANCE = timedelta(minutes=1)
MINTABLE_CLASSES = ("baseline", "graduated", "approved")

ProviderFactory = Callable[[str, Mapping[str, Any], str], CredentialProvider]
SecretResolver = Callable[[str], str]


@dataclass(frozen=True)
class LeaseRequest:
    """One ``credentials`` entry of the launch plan (docs/plan-format.md)."""

    name: str
    provider: str
    type: str
    scope: str
    scope_spec: Mapping[str, Any]
    ttl_seconds: int
    renewals: int
    budget_seconds: int
    secret_ref: str
    standing: bool
    klass: str
    category: str = ""

    @classmethod
    def from_plan(cls, entry: Mapping[str, Any]) -> LeaseRequest:
        return cls(
            name=str(entry["name"]),
            provider=str(entry["provider"]),
            type=str(entry["type"]),
            scope=str(entry["scope"]),
            scope_spec=dict(entry.get("scope_spec") or {}),
            ttl_seconds=int(entry["ttl_seconds"]),
            renewals=int(entry["renewals"]),
            budget_seconds=int(entry["budget_seconds"]),
            secret_ref=str(entry["secret_ref"]),
            standing=bool(entry.get("standing", False)),
            klass=str(entry["class"]),
            category=str(entry.get("category", "")),
        )

    def ledger_fields(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provider": self.provider,
            "type": self.type,
            "scope": self.scope,
            "scope_spec": dict(self.scope_spec),
            "secret_ref": self.secret_ref,
            "class": self.klass,
        }


@dataclass(frozen=True)
class Budget:
    """What an approval grants: hold the scope this long, with at most this many renewals."""

    seconds: int
    renewals: int

    @classmethod
    def of(cls, request: LeaseRequest) -> Budget:
        return cls(request.budget_seconds, request.renewals)


class Broker:
    """Acquires leases for one run; every lease it hands out is in the ledger first."""

    def __init__(
        self,
        store: StateStore,
        *,
        run_id: str | None = None,
        clock: Clock | None = None,
        provider_factory: ProviderFactory | None = None,
        resolver: SecretResolver = resolve,
        redactor: Redactor | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.ledger = Ledger(store, self.clock)
        self.owner = Owner.current(run_id or new_id("run-"))
        self.redactor = redactor or Redactor()
        # By default providers are built with this broker's clock (leases and what the
        # provider dates itself agree).
        self._factory = provider_factory or functools.partial(build_provider, clock=self.clock)
        self._resolver = resolver
        self._providers: dict[tuple[str, str, str], CredentialProvider] = {}
        self.leases: list[Lease] = []

    def acquire(self, request: LeaseRequest, budget: Budget | None = None) -> Lease:
        """Mint the first lease of ``request`` inside ``budget`` (default: the plan's)."""
        budget = budget or Budget.of(request)
        lease_id = new_id("L-")
        refusal = self._refusal(request)
        if refusal:
            self.ledger.record_intent(
                lease=lease_id,
                request=request.ledger_fields(),
                ttl_seconds=0,
                owner=self.owner,
                state="refused",
                note=refusal,
            )
            raise RefusedError(
                f"credential {request.name} ({request.category or request.type}) refused:"
                f" {refusal}",
                hint="approve it (plan → approve → apply) or mark it baseline in its manifest",
            )
        # The provider is built (its SDK imported, the root secret read) before the budget's
        # clock starts: set-up time must not eat the budget (a 15m budget holding one 15m
        # lease was refused as 899 s < 900 s when boto3's import took over half a second).
        self.provider_for(request)
        lease = Lease(self, request, budget, lease_id, self.clock.now())
        lease._mint_next()
        self.leases.append(lease)
        return lease

    def release_all(self) -> list[str]:
        """Release every lease of this run; return messages for the ones that failed."""
        problems: list[str] = []
        for lease in self.leases:
            try:
                lease.release()
            except KaguraError as exc:
                problems.append(exc.message)
        return problems

    def provider_for(self, request: LeaseRequest) -> CredentialProvider:
        key = (request.type, request.secret_ref, json.dumps(request.scope_spec, sort_keys=True))
        if key not in self._providers:
            # Before the root secret is read: never towards an endpoint it must not reach.
            check_endpoints(request.scope_spec)
            secret = self._resolver(request.secret_ref)
            self.redactor.add(secret)
            self._providers[key] = self._factory(request.type, request.scope_spec, secret)
        return self._providers[key]

    @staticmethod
    def _refusal(request: LeaseRequest) -> str | None:
        if request.klass not in MINTABLE_CLASSES:
            return (
                f"its class is {request.klass!r}; only baseline, graduated or approved"
                " credentials are minted (default deny)"
            )
        if request.type == "static" and not request.standing:
            return "a static credential needs standing: true in its provider manifest"
        return None


@dataclass
class Lease:
    """A credential held for a run: the current mint plus the budget left."""

    broker: Broker = field(repr=False)
    request: LeaseRequest = field(repr=False)
    budget: Budget
    id: str
    started_at: datetime
    renewals_used: int = 0
    grant: str = ""
    minted: Minted | None = field(default=None, repr=False)
    minted_at: datetime | None = None  # when the current credential was minted
    closed: bool = False
    retries: int = 0  # failed renewals re-attempted on a later tick (the run's cost history)

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def budget_ends_at(self) -> datetime:
        return self.started_at + timedelta(seconds=self.budget.seconds)

    @property
    def expires_at(self) -> datetime:
        """When the current credential stops being ours: its expiry or the budget's end."""
        assert self.minted is not None
        return min(self.minted.expires_at, self.budget_ends_at)

    @property
    def bundle(self) -> Bundle:
        if self.minted is None or self.closed:
            raise RefusedError(f"credential {self.name} is not held (released or exhausted)")
        return self.minted.bundle

    def margin(self, most: timedelta = RENEW_MARGIN) -> timedelta:
        """How long before its expiry the current credential is renewed: ``most``, or a
        third of a shorter credential's life (a 1-minute lease is not renewed at once)."""
        if self.minted_at is None:
            return most
        return min(most, (self.expires_at - self.minted_at) / 3)

    def due(self, margin: timedelta = RENEW_MARGIN) -> bool:
        return not self.closed and self.broker.clock.now() >= self.expires_at - self.margin(margin)

    @property
    def last(self) -> bool:
        """Whether the current credential is the last its budget allows: it reaches the
        budget's end, no renewal is left, or what the budget would leave at the renewal
        is shorter than the provider mints."""
        if self.renewals_used >= self.budget.renewals or self.minted is None:
            return True
        if self.expires_at >= self.budget_ends_at:
            return True  # it already reaches the budget's end
        renewal = self.expires_at - self.margin()
        shortest = timedelta(seconds=self.broker.provider_for(self.request).min_ttl)
        return self.budget_ends_at - renewal < shortest

    @property
    def held_until(self) -> datetime:
        """When the lease fails closed if its budget does not grow: ``FINAL_MARGIN``
        before the end of its last credential (while renewals remain: of its budget)."""
        end = self.expires_at if self.last else self.budget_ends_at
        return end - FINAL_MARGIN

    def tick(self, margin: timedelta = RENEW_MARGIN) -> Minted | None:
        """Heartbeat; renew when the credential is within ``margin`` (or a third of its
        life) of expiring, and hold the last one to its end.

        Returns the new Minted when it renewed (push its bundle), None otherwise. Raises
        RefusedError when the budget is exhausted (the credential is already revoked).
        """
        if self.closed:
            return None
        self.broker.ledger.heartbeat(self.id)
        if self.minted is not None and self.last:
            if self.broker.clock.now() >= self.expires_at - FINAL_MARGIN:
                self._exhaust(self._why_last())
            return None
        if not self.due(margin):
            return None
        try:
            return self.renew()
        except SetupError as exc:
            # A failed mint: retry on the next tick while the current credential is still
            # good; once it has expired, fail closed.
            if self.broker.clock.now() < self.expires_at:
                self.retries += 1
                return None
            self._exhaust(f"it expired and could not be renewed: {exc.message}")

    def renew(self) -> Minted:
        """Mint a fresh credential and revoke the previous one; fail closed past the budget."""
        if self.closed:
            raise RefusedError(f"credential {self.name} was released; it cannot be renewed")
        if self.renewals_used >= self.budget.renewals:
            self._exhaust(f"all {self.budget.renewals} renewals used")
        previous = (self.grant, self.minted)
        self._mint_next()
        self.renewals_used += 1
        # A failed revoke of the old credential stays open in the ledger for the sweeper;
        # the run continues on the new one.
        self._revoke(*previous, note="superseded by renewal", strict=False)
        assert self.minted is not None
        return self.minted

    def release(self) -> None:
        """Revoke the current credential (where possible) and close its ledger row."""
        if self.closed:
            return
        self.closed = True
        self._revoke(self.grant, self.minted, note="released", strict=True)

    def _ttl(self) -> int:
        # round, not int: microseconds after started_at must not cost a whole second
        # (a 15m budget holding one 15m lease would be refused as 899 s < 900 s).
        remaining = round((self.budget_ends_at - self.broker.clock.now()).total_seconds())
        return first_lease_seconds(self.request.ttl_seconds, remaining)

    def _mint_next(self) -> None:
        broker = self.broker
        # The time left is read before the provider is built: building it (an SDK client)
        # can take a second under load, which would cut a 15m budget to 899 s < 900 s.
        ttl = self._ttl()
        provider = broker.provider_for(self.request)
        if ttl < provider.min_ttl:
            self._exhaust(f"{max(ttl, 0)} s of the {self.budget.seconds} s budget left")
        grant = broker.ledger.record_intent(
            lease=self.id, request=self.request.ledger_fields(), ttl_seconds=ttl, owner=broker.owner
        )
        try:
            minted = provider.mint(self.request.scope_spec, ttl, grant)
        except ProviderError as exc:
            message = broker.redactor.scrub(str(exc))
            broker.ledger.record_failure(grant, message, poison=False, next_attempt_at=None)
            # Intent stays open when the failure is ambiguous (the mint may have landed);
            # the sweeper finds and revokes it. A definite refusal closes the row, and so
            # does a request that never reached the provider (no credential can exist: left
            # open, a provider the sweeper cannot revoke would show it "lapsing" for its ttl).
            if not exc.transient or exc.unsent:
                broker.ledger.close(grant, "failed", note=message)
            raise SetupError(f"could not mint credential {self.name}: {message}") from None
        broker.redactor.add(*minted.sensitive_values())
        broker.ledger.record_minted(grant, minted.id, minted.expires_at)
        outlives = minted.expires_at - (self.budget_ends_at + OUTLIVE_TOLERANCE)
        if outlives > timedelta(0):
            # The provider's credential would still work after the lease's budget (an API
            # that ignored the duration asked): never handed out. Revoked where the
            # provider can; otherwise it lapses at its expiry, which the ledger keeps.
            why = (
                f"the provider's credential would outlive its lease budget (it expires"
                f" {iso(minted.expires_at)}, the budget ends {iso(self.budget_ends_at)})"
            )
            self._revoke(grant, minted, note=why, strict=False, state="failed")
            raise SetupError(f"could not mint credential {self.name}: {why}")
        self.grant, self.minted = grant, minted
        self.minted_at = broker.clock.now()

    def _revoke(
        self,
        grant: str,
        minted: Minted | None,
        *,
        note: str,
        strict: bool,
        state: str = "released",
    ) -> None:
        broker = self.broker
        if minted is None:
            return
        revoked = False
        try:
            revoked = broker.provider_for(self.request).revoke(minted.id)
        except ProviderError as exc:
            if not exc.gone:
                message = broker.redactor.scrub(str(exc))
                # Left open for the sweeper: this process will exit, the row is orphaned.
                broker.ledger.record_failure(
                    grant, message, poison=not exc.transient, next_attempt_at=None
                )
                if strict:
                    raise SetupError(
                        f"could not revoke credential {self.name}: {message}",
                        hint="kagura-agent leases sweep retries it; leases list shows it",
                    ) from None
                return
            revoked = True
        if not revoked:
            traits = traits_of(self.request.type)
            if traits is not None and traits.release == "standing":
                note = f"{note}; {traits.says()}"
            else:
                # It still works until its expiry: closed as lapsing, not released, and
                # `leases list` keeps it in view until then.
                note = f"{note}; not revocable, lapses at {iso(minted.expires_at)}"
                state = "lapsing" if state == "released" else state
        broker.ledger.close(grant, state, note=note)

    def _why_last(self) -> str:
        if self.renewals_used >= self.budget.renewals:
            return f"all {self.budget.renewals} renewals used, its last credential ends"
        return f"its {self.budget.seconds} s budget ends"

    def _exhaust(self, why: str) -> NoReturn:
        try:
            self.release()
        except KaguraError:
            why += "; revoking it failed, the sweeper retries"
        raise RefusedError(
            f"credential {self.name}: budget exhausted ({why}); the run must stop",
            hint="re-plan and approve a larger budget (budget_seconds / renewals)",
        )
