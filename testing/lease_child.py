"""A process that holds a Cloudflare lease and dies at a chosen point — for crash tests.

    python -m testing.lease_child --endpoint URL --crash POINT

The root token is read through the reference env:KAGURA_TEST_CF_ROOT; the state store is
$KAGURA_AGENT_STATE_DIR. POINT is one of:

    after-intent   die inside mint, before the provider is called (intent row only)
    after-mint     die right after the provider minted, before the ledger records it
    after-renew    die after a renewal minted and was recorded, before the old one is revoked
    after-revoke   die on release after the provider revoked, before the row is closed
    hold           print "LIVE <lease>" and block until killed (kill -9 from the test)

Dying is ``os._exit(137)``: no finally blocks, no atexit — the same as SIGKILL for the ledger.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from kagura_agent.membrane.leases import Broker, LeaseRequest
from kagura_agent.membrane.providers import CredentialProvider, Minted, build_provider
from kagura_agent.state import open_store

SCOPE = {
    "permission_groups": ["c8fed203ed3043cba015a93ad1616f1f"],
    "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
}


def request(endpoint: str) -> LeaseRequest:
    return LeaseRequest.from_plan(
        {
            "name": "cf-dns",
            "provider": "cloudflare-main",
            "type": "cloudflare",
            "scope": "dns-edit",
            "scope_spec": {
                **SCOPE,
                "endpoint": endpoint,
                "max_retries": 0,
                "endpoint_addresses": ["127.0.0.1/32"],
            },
            "ttl_seconds": 900,
            "renewals": 2,
            "budget_seconds": 3600,
            "secret_ref": "env:KAGURA_TEST_CF_ROOT",
            "standing": False,
            "class": "baseline",
            "category": "credential:cloudflare-main/dns-edit",
        }
    )


class Crashing:
    """Wraps the real provider and dies at the chosen point."""

    def __init__(self, inner: CredentialProvider, crash: str) -> None:
        self.inner = inner
        self.crash = crash
        self.kind = inner.kind
        self.revocable = inner.revocable
        self.min_ttl = inner.min_ttl
        self.max_ttl = inner.max_ttl
        self.mints = 0

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        if self.crash == "after-intent":
            os._exit(137)
        minted = self.inner.mint(scope_spec, ttl_seconds, lease_id)
        self.mints += 1
        if self.crash == "after-mint":
            os._exit(137)
        return minted

    def revoke(self, minted_id: str) -> bool:
        if self.crash == "after-renew" and self.mints == 2:
            os._exit(137)
        revoked = self.inner.revoke(minted_id)
        if self.crash == "after-revoke":
            os._exit(137)
        return revoked

    def find(self, lease_id: str) -> list[str]:
        return self.inner.find(lease_id)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--crash", required=True)
    args = parser.parse_args(argv)

    def factory(kind: str, spec: Mapping[str, Any], secret: str) -> CredentialProvider:
        return Crashing(build_provider(kind, spec, secret), args.crash)

    broker = Broker(open_store(), run_id="run-child", provider_factory=factory)
    lease = broker.acquire(request(args.endpoint))
    if args.crash == "after-renew":
        lease.renew()
    if args.crash == "after-revoke":
        lease.release()
    print(f"LIVE {lease.id}", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
