"""``kagura-agent memory``: search, show, forget and export memories.

memory search QUERY [--type T] [--untrusted] [-k N] [--json]
memory show ID [--json]
memory forget ID [--cascade] [--reason TEXT]
memory trust ID --reason TEXT
memory export [--json]

Every subcommand opens the store the plan would: the default Memory manifest of the
manifest set (``--manifests DIR``), or the one named with ``--memory NAME``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kagura_agent.cli.common import add_manifest_option, count, print_ok
from kagura_agent.hygiene import neutralise


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("memory", help="search, show, forget and export memories")
    commands = parser.add_subparsers(dest="memory_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda args: _usage(parser))

    search = commands.add_parser("search", help="full-text recall (trusted memories by default)")
    search.add_argument("query")
    search.add_argument("--type", help="only memories of this type")
    search.add_argument("--untrusted", action="store_true", help="include untrusted memories")
    search.add_argument("-k", type=count(0, 1000), default=10, help="how many results (default 10)")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(handler=_search)

    show = commands.add_parser("show", help="one memory with its provenance and edges")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_show)

    forget = commands.add_parser("forget", help="erase a memory, leaving a tombstone")
    forget.add_argument("id")
    forget.add_argument(
        "--cascade", action="store_true", help="also erase memories derived from it"
    )
    forget.add_argument("--reason", default="", help="recorded in the tombstone")
    forget.add_argument("--json", action="store_true", help="print JSON")
    forget.set_defaults(handler=_forget)

    trust = commands.add_parser(
        "trust",
        help="raise a memory to trusted (an operator's decision, logged with who, when, why)",
    )
    trust.add_argument("id")
    trust.add_argument("--reason", required=True, help="why (recorded in the approval log)")
    trust.add_argument("--json", action="store_true", help="print JSON")
    trust.set_defaults(handler=_trust)

    export = commands.add_parser("export", help="every memory, oldest first")
    export.add_argument("--json", action="store_true", help="print one JSON document")
    export.set_defaults(handler=_export)
    _store_options(search, show, forget, trust, export)


def _store_options(*parsers: argparse.ArgumentParser) -> None:

    for parser in parsers:
        add_manifest_option(parser)
        parser.add_argument(
            "--memory", metavar="NAME", help="a Memory manifest other than the default"
        )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def memory_section(manifests: str | None, name: str | None = None) -> dict[str, Any]:
    """The memory section a plan made from ``manifests`` would carry (default manifest)."""
    from kagura_agent.errors import UsageError
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.memory.factory import section_from_manifest

    catalog = load_workspace(manifests, []).catalog
    manifest = catalog.get("Memory", name) if name else catalog.default("Memory")
    if name and manifest is None:
        known = ", ".join(catalog.names("Memory")) or "(none)"
        raise UsageError(f"unknown Memory {name!r}", hint=f"known Memory names: {known}")
    if manifest is None:
        return section_from_manifest(None, None)
    return section_from_manifest(manifest.name, manifest.spec)


def _open(args: argparse.Namespace) -> Any:
    from kagura_agent.memory import open_memory

    return open_memory(memory_section(args.manifests, args.memory))


def _line(memory: Any) -> str:
    """One memory, on one line whatever its summary holds (hygiene.neutralise: the
    agent's notes are its writing, like the hosts and paths of ``egress log``), the
    untrusted flag before the summary."""
    flag = "[UNTRUSTED] " if memory.untrusted else ""
    return f"{memory.id}  {memory.type:<10} {flag}{_shown(memory.summary)}"


def _shown(value: object) -> str:
    return neutralise(str(value), newlines=False)


def _search(args: argparse.Namespace) -> int:
    from kagura_agent.errors import UsageError

    if args.k < 1:
        raise UsageError("-k must be at least 1")
    store = _open(args)
    try:
        found = store.recall(args.query, k=args.k, type=args.type, include_untrusted=args.untrusted)
        if args.json:
            print_ok({"results": [m.to_json() for m in found]})
        else:
            for memory in found:
                print(_line(memory))
            if not found:
                print("no memories found", file=sys.stderr)
    finally:
        store.close()
    return 0


def _show(args: argparse.Namespace) -> int:
    from kagura_agent.clock import iso
    from kagura_agent.errors import UsageError

    store = _open(args)
    try:
        memory = store.get(args.id)
        if memory is None:
            raise UsageError(f"no memory {args.id}")
        edges = store.edges(args.id)
        if args.json:
            data = {**memory.to_json(), "edges": [e.to_json() for e in edges]}
            print_ok(data)
            return 0
        # Every field on its own line, whatever it holds (an agent's note chose most).
        flag = "[UNTRUSTED] " if memory.untrusted else ""
        print(f"id:        {_shown(memory.id)}")
        print(f"type:      {_shown(memory.type)}")
        print(f"summary:   {flag}{_shown(memory.summary)}")
        print(f"source:    {_shown(memory.source.kind)} {_shown(memory.source.id)}")
        print(f"trust:     {_shown(memory.trust)}")
        print(f"created:   {iso(memory.created)}")
        print(f"task_kind: {_shown(memory.task_kind or '-')}")
        print(f"tags:      {_shown(', '.join(memory.tags) or '-')}")
        print(f"details:   {json.dumps(dict(memory.details), sort_keys=True)}")
        for edge in edges:
            # The edge's evidence and maker (a fix's changes, a brain link's run), if any.
            shown = f"  {json.dumps(dict(edge.details), sort_keys=True)}" if edge.details else ""
            print(
                f"edge:      {_shown(edge.source_id)} -{_shown(edge.type)}->"
                f" {_shown(edge.target_id)}{shown}"
            )
    finally:
        store.close()
    return 0


def _forget(args: argparse.Namespace) -> int:
    from kagura_agent.errors import UsageError
    from kagura_agent.patterns.erasure import forget

    store = _open(args)
    try:
        tombstones = forget(store, args.id, cascade=args.cascade, reason=args.reason)
    finally:
        store.close()
    if not tombstones:
        raise UsageError(f"no memory {args.id}")
    if args.json:
        print_ok({"forgotten": [t.to_json() for t in tombstones]})
    else:
        for tombstone in tombstones:
            why = f" (derived from {tombstone.cascade_of})" if tombstone.cascade_of else ""
            print(f"forgot {_shown(tombstone.memory_id)} {_shown(tombstone.type)}{why}")
    return 0


def _trust(args: argparse.Namespace) -> int:
    """Only this command raises a memory's tier; the approval log keeps who, when and why."""
    from kagura_agent.approvals.asking import operator_name
    from kagura_agent.approvals.log import Verdict, record_decision
    from kagura_agent.clock import SystemClock
    from kagura_agent.errors import UsageError
    from kagura_agent.state import open_store

    reason = args.reason.strip()
    if not reason or len(reason) > 500:
        raise UsageError("--reason must say why, in 1 to 500 characters")
    store = _open(args)
    try:
        set_trust = getattr(store, "set_trust", None)
        if set_trust is None:
            raise UsageError(f"the {store.backend} memory backend cannot change a memory's trust")
        memory = store.get(args.id)
        if memory is None:
            raise UsageError(f"no memory {args.id}")
        with open_store() as state:
            decision = record_decision(
                state,
                Verdict(
                    category=f"memory:{memory.id}",
                    fingerprint=None,
                    outcome="approved",
                    who=operator_name(),
                    via="cli",
                    kind="memory-trust",
                    reason=f"{memory.trust} -> trusted: {reason}",
                ),
                clock=SystemClock(),
            )
        raised = set_trust(memory.id, "trusted")
    finally:
        store.close()
    if args.json:
        print_ok({"memory": raised.to_json(), "decision": decision.to_json()})
    else:
        print(
            f"{memory.id} is trusted (was {memory.trust}); logged: {decision.who}"
            f" at {decision.to_json()['decided_at']}: {reason}"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        memories = [m.to_json() for m in store.export()]
        tombstones = [t.to_json() for t in store.tombstones()]
    finally:
        store.close()
    if args.json:
        print_ok({"memories": memories, "tombstones": tombstones})
    else:
        # JSON lines: one memory per line, easy to stream into other tools (ASCII: every
        # control character and line separator an escape).
        for memory in memories:
            print(json.dumps(memory, sort_keys=True, ensure_ascii=True))
    return 0
