"""Cost of crash safety: a ledgered lease (intent → mint → live → revoke → closed, each a
durable SQLite commit) against the bare provider mint + revoke, both through the real
Cloudflare SDK against the local fake, measured in the same run.

    python bench/leases.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kagura_agent.membrane.leases import Broker, LeaseRequest
from kagura_agent.membrane.providers import build_provider
from kagura_agent.state import StateStore
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare

# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"

ROUNDS = 1 if QUICK else 60


def main() -> None:
    fake = FakeCloudflare().start()
    spec = {
        "permission_groups": ["4755a26eedb94da69e1066d98aa820be"],
        "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
        "endpoint": fake.url + "/client/v4",
        "endpoint_addresses": ["127.0.0.1/32"],
        "max_retries": 0,
    }
    provider = build_provider("cloudflare", spec, ROOT_TOKEN)
    os.environ["KAGURA_BENCH_CF_ROOT"] = ROOT_TOKEN
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp) / "state.db")
        # One SDK client for both sides, so only the ledger differs.
        broker = Broker(
            store, run_id="bench", provider_factory=lambda kind, settings, secret: provider
        )
        request = LeaseRequest.from_plan(
            {
                "name": "cf",
                "provider": "cf",
                "type": "cloudflare",
                "scope": "dns",
                "scope_spec": spec,
                "ttl_seconds": 900,
                "renewals": 0,
                "budget_seconds": 900,
                "secret_ref": "env:KAGURA_BENCH_CF_ROOT",
                "standing": False,
                "class": "baseline",
            }
        )
        bare: list[float] = []
        ledgered: list[float] = []
        for index in range(ROUNDS):
            start = time.perf_counter()
            minted = provider.mint(spec, 900, f"bare-{index}")
            provider.revoke(minted.id)
            bare.append(time.perf_counter() - start)

            start = time.perf_counter()
            broker.acquire(request).release()
            ledgered.append(time.perf_counter() - start)
        store.close()
    fake.stop()
    bare_ms = statistics.median(bare) * 1000
    ledger_ms = statistics.median(ledgered) * 1000
    print(f"bare mint+revoke  median {bare_ms:.2f} ms")
    print(f"ledgered lease    median {ledger_ms:.2f} ms")
    print(
        f"RESULT leases acquire_release_ms={ledger_ms:.2f} baseline_mint_revoke_ms={bare_ms:.2f}"
        f" overhead_ratio={ledger_ms / bare_ms:.2f}"
    )


if __name__ == "__main__":
    main()
