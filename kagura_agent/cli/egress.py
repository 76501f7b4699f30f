"""``kagura-agent egress``: the proxy's allow/deny decisions of a run, and the crash sweep."""

from __future__ import annotations

import argparse
from typing import Any

from kagura_agent.cli.common import add_manifest_option, count, print_ok


def register(subparsers: Any) -> None:
    """Add ``egress log [RUN]`` and ``egress sweep``."""
    parser = subparsers.add_parser("egress", help="egress proxy audit log and cleanup")
    sub = parser.add_subparsers(dest="egress_command", metavar="ACTION", required=True)

    log = sub.add_parser("log", help="every allow/deny decision of a run (latest by default)")
    log.add_argument("run", nargs="?", metavar="RUN", help="run id (default: the latest run)")
    log.add_argument("--denied", action="store_true", help="only denials")
    log.add_argument("--json", action="store_true", help="one JSON object: events + summary")
    log.set_defaults(handler=_log)

    sweep = sub.add_parser(
        "sweep",
        help="remove proxies and networks of runs that are gone (this state store's)",
        description="Remove the egress proxies, networks and socket volumes that runs of"
        " this state store left when their process died (their decisions are stored first)."
        " Other state directories' objects on the same Docker daemon are theirs: only --all"
        " takes them.",
    )
    sweep.add_argument(
        "--all",
        action="store_true",
        dest="everyone",
        help="every dead owner's objects on the Docker daemon, whatever state store made"
        " them (also those of earlier versions, and containers of dead runs)",
    )
    sweep.add_argument("--json", action="store_true", help="print removed names as JSON")
    sweep.set_defaults(handler=_sweep)

    pool = sub.add_parser("pool", help="the warm pool of egress sessions on this host")
    pool_sub = pool.add_subparsers(dest="pool_command", metavar="ACTION", required=True)
    serve = pool_sub.add_parser(
        "serve",
        help="keep idle egress sessions ready for runs, until stopped (Ctrl-C / SIGTERM)",
    )
    add_manifest_option(serve)
    serve.add_argument(
        "--size", type=count(0, 64), help="idle sessions to hold (default: the Policy's)"
    )
    serve.add_argument(
        "--idle-expiry",
        type=count(1, 30 * 86400),
        metavar="S",
        help="seconds before an idle one is replaced",
    )
    serve.set_defaults(handler=_pool_serve)
    status = pool_sub.add_parser("status", help="the pool's sessions: idle, claimed, retired")
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.set_defaults(handler=_pool_status)


def _log(args: argparse.Namespace) -> int:
    from kagura_agent.errors import UsageError
    from kagura_agent.hygiene import neutralise
    from kagura_agent.membrane.egress import audit
    from kagura_agent.state import open_store

    with open_store() as store:
        store = audit.open_store(store)
        run_id = args.run or audit.latest_run(store)
        if run_id is None:
            raise UsageError("no egress runs recorded yet")
        if audit.run_allowlist(store, run_id) is None:
            raise UsageError(f"no egress record for run {run_id!r}")
        events = audit.load_events(store, run_id)
        summary = audit.denial_summary(events)
        unstored = audit.unstored(store, run_id)
        if args.denied:
            events = [e for e in events if e.decision == "deny"]
        # Decisions the crash sweep stored after the run was killed: what the agent chose
        # is withheld (its redactor died with it; audit.withheld).
        withheld = sum(1 for e in events if audit.WITHHELD in (e.host, e.path, e.method))
        if args.json:
            body = {"run_id": run_id, "events": [e.to_json() for e in events], "denials": summary}
            print_ok({**body, "unstored": unstored, "withheld": withheld})
            return 0
        print(f"egress decisions of run {run_id}: {len(events)}")
        for e in events:
            # An allowed request names its entry; one on the injecting port has none. The
            # host, path and method are the agent's: one line each, whatever they hold.
            why = (e.entry or e.reason) if e.decision == "allow" else e.reason
            where = neutralise(f"{e.host}:{e.port}{e.path}", newlines=False)
            method = neutralise(e.method, newlines=False)
            print(
                f"{e.time}  {e.decision.upper():<5} {method:<7} {where:<22}"
                f" {e.status:>3}  in={e.bytes_in} out={e.bytes_out}  {neutralise(why, newlines=False)}"
            )
        if sum(unstored.values()):
            print(
                "not stored (past the run's ceiling of decisions):"
                f" {unstored['allow']} allowed, {unstored['deny']} denied"
            )
        if withheld:
            print(
                f"{withheld} decision(s) stored after the run was killed: the host, path and"
                f" other texts the agent chose show as {audit.WITHHELD} (its redactor died"
                " with it, and they may carry a credential it held)"
            )
        if summary:
            print("denied (what the agent tried to reach):")
            for row in summary:
                denied = f"{row['method']} {row['host']}:{row['port']} ({row['reason']})"
                print(f"  {row['count']:>4}x {neutralise(denied, newlines=False)}")
        return 0


def _sweep(args: argparse.Namespace) -> int:
    from kagura_agent.membrane.egress import audit
    from kagura_agent.membrane.egress.sweep import sweep_orphans
    from kagura_agent.membrane.runtime import connect, docker_errors
    from kagura_agent.state import open_store

    with docker_errors("sweeping egress orphans"), open_store() as store:
        removed = sweep_orphans(connect(), audit.open_store(store), everyone=args.everyone)
    scope = "all" if args.everyone else "store"
    if args.json:
        print_ok({"removed": removed, "scope": scope})
    else:
        print("\n".join(removed) or "nothing to sweep")
        if not args.everyone:
            print("(this state store's objects only; --all sweeps the whole Docker daemon)")
    return 0


def _pool_serve(args: argparse.Namespace) -> int:
    import signal
    import sys
    from types import FrameType

    from kagura_agent.manifest.egresspool import egress_pool_knobs
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.membrane.egress.pool import Keeper, PoolSettings
    from kagura_agent.membrane.runtime import connect

    knobs = egress_pool_knobs(load_workspace(args.manifests, []).catalog)
    settings = PoolSettings(
        size=knobs.size if args.size is None else max(0, args.size),
        idle_expiry_seconds=(
            knobs.idle_expiry_seconds if args.idle_expiry is None else args.idle_expiry
        ),
    )

    def log(line: str) -> None:
        print(f"egress pool: {line}", file=sys.stderr, flush=True)

    from kagura_agent.membrane.egress import audit
    from kagura_agent.state import open_store

    store = audit.open_store(open_store())
    keeper = Keeper(connect(), settings, log=log, store=store)

    def stop(signum: int, frame: FrameType | None) -> None:
        keeper.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log(f"keeping {settings.size} idle session(s), replaced after {settings.idle_expiry_seconds}s")
    try:
        keeper.serve()
    finally:
        store.close()
    log("stopped; idle sessions removed")
    return 0


def _pool_status(args: argparse.Namespace) -> int:
    from kagura_agent.membrane.egress import pool

    rows = [
        {"name": e.name, "state": e.state, "claimer": e.claimer or None} for e in pool.entries()
    ]
    if args.json:
        print_ok({"sessions": rows})
        return 0
    for row in rows:
        claimer = f"  claimed by {row['claimer']}" if row["claimer"] else ""
        print(f"{row['name']}  {row['state']}{claimer}")
    if not rows:
        print("no pooled egress sessions (start the keeper: kagura-agent egress pool serve)")
    return 0
