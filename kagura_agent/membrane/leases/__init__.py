"""Leased credentials: broker (acquire/renew/release), durable ledger, sweeper, delivery."""

from kagura_agent.membrane.leases.broker import Broker, Budget, Lease, LeaseRequest
from kagura_agent.membrane.leases.keeper import deliver, keep_fresh, withdraw
from kagura_agent.membrane.leases.ledger import GrantRow, Ledger
from kagura_agent.membrane.leases.sweeper import Sweeper, SweepReport, sweep

__all__ = [
    "Broker",
    "Budget",
    "GrantRow",
    "Lease",
    "LeaseRequest",
    "Ledger",
    "SweepReport",
    "Sweeper",
    "deliver",
    "keep_fresh",
    "sweep",
    "withdraw",
]
