"""The ``runs`` table's schema: one row per apply (apply/runs.py writes it; apply/written.py
reads the windows in which each run's agent could write its project root)."""

from __future__ import annotations

MIGRATIONS = [
    """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        task TEXT NOT NULL,
        session TEXT,
        fingerprint TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_start TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        outcome TEXT,
        exit_code INTEGER
    );
    CREATE INDEX runs_open ON runs(ended_at);
    """,
    # The applying process's host (processes.this_host): a shared state store holds the runs
    # of many hosts, and only the host that ran one can remove its containers.
    "ALTER TABLE runs ADD COLUMN host TEXT",
    # The project root and the ctime bound of its setuid/setgid check (setid.py): a run
    # killed before its check gets it from the next apply's sweep.
    """
    ALTER TABLE runs ADD COLUMN project_root TEXT;
    ALTER TABLE runs ADD COLUMN setid_since BIGINT;
    """,
    # The turns the brain reported and the model calls the host counted at the proxy
    # (apply/modelcalls.py; NULL when not counted): an operator sees where they differ.
    """
    ALTER TABLE runs ADD COLUMN turns INTEGER;
    ALTER TABLE runs ADD COLUMN model_calls INTEGER;
    """,
    # When the run could start writing its root, and when it could no longer (ns, host
    # clock): what it may have written is judged by ctime against them (written.py).
    """
    ALTER TABLE runs ADD COLUMN opened_ns BIGINT;
    ALTER TABLE runs ADD COLUMN closed_ns BIGINT;
    """,
    # The project root's POSIX ACLs at the start of the run (acl.snapshot; NULL: not
    # recorded): the walk after it keeps them (apply/acl.py).
    "ALTER TABLE runs ADD COLUMN root_acl TEXT",
    # The task kind, the budget in force with the forecast it was learnt from (JSON: the
    # plan's budget turns, cost_usd, wall_seconds and forecast) and the dollars the brain
    # reported: the web console's runs list and cost chart read them. Runs are listed
    # newest first.
    """
    ALTER TABLE runs ADD COLUMN kind TEXT;
    ALTER TABLE runs ADD COLUMN budget TEXT;
    ALTER TABLE runs ADD COLUMN cost_usd REAL;
    CREATE INDEX runs_started ON runs(started_at);
    CREATE INDEX runs_kind ON runs(kind, started_at);
    """,
]
