"""Team mode: saved, approved plans queued on PostgreSQL and applied by runners.

    apply --queue PLAN.json ─▶ kagura_team_runs row (queued) + a procrastinate job on the
                               queue of the plan's runtime and tenancy, locked on its root
    kagura-agent runner     ─▶ a procrastinate worker per Docker host: takes jobs of the
                               queues it can honour, applies each with ``kagura-agent apply``
                               (the saved-plan path, fingerprint check and all), streams
                               its events into kagura_team_events
    every runner's reaper   ─▶ jobs of runners whose heartbeat stopped: run marked lost,
                               its leases revoked from the state store's ledger

procrastinate (and psycopg under it) is imported only here, lazily: ``validate`` and
``plan`` never load it. Install with the ``team`` extra.
"""
