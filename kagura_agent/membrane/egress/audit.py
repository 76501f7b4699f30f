"""Every allow and deny decision of a run's proxy, as structured events.

squid writes one ``KAGURA1`` line per request to stdout (see squid.LOG_FORMAT), and so
does the key-injecting port (modelport.py: its refusals carry the model-call policy's
reason, its allowed calls how they were counted in the status field). The host
parses each line, names the allowlist entry that matched (computed here from the plan's
allowlist, with the same semantics squid was configured with), stores it in the state
store and hands it to the run's event stream. ``seq`` is the line's index in the proxy's
output, so reading the same log twice (live, then again at teardown or in a crash sweep)
never stores an event twice.

What the agent makes the host keep is bounded: a run stores at most ``EVENT_CEILING``
decisions; the ones past it are counted in its ``egress_runs`` row (``seen``,
``unstored_allow``, ``unstored_deny``), never dropped silently. The proxy's log is read at
most ``LOG_CEILING`` bytes far (:func:`log_lines`); the live collector stops the run when
the log grows past it (session.py), and Docker keeps at most ``LOG_KEEP`` bytes of it on
disk, far more than the ceiling, so no line is rotated away before the stop and the
numbering holds.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from kagura_agent.manifest.hosts import is_ip_literal
from kagura_agent.membrane.egress.modelport import INJECT_PORT, LOCAL_KIND, MODEL_REASONS
from kagura_agent.membrane.egress.policy import EgressPolicy
from kagura_agent.membrane.egress.squid import DENY_REASONS, LOG_TAG
from kagura_agent.state import StateStore
from kagura_agent.state.sql import Migration, with_rowid

COMPONENT = "egress"
# Bytes of the proxy's access log a run may produce (an honest request logs ~150 bytes:
# ~220,000 requests); past it the run is stopped as a flood (session.py, tripwire.py).
LOG_CEILING = 32 * 1024 * 1024
# What Docker keeps of a proxy's log on disk (json-file: LOG_FILES files of LOG_FILE_SIZE).
# The JSON framing adds ~70 bytes a line, at most doubling the shortest line squid writes
# (an empty connection's, ~68 bytes; measured in a flood: json-file 1.9x the log),
# and squid's stderr shares the file: 4x the ceiling keeps at least 2x what a run can
# write before its stop, so no line is rotated away before the stop (docker logs reads
# the rotated file too).
LOG_FILE_SIZE = 64 * 1024 * 1024
LOG_FILES = 2
LOG_KEEP = LOG_FILE_SIZE * LOG_FILES
# Decisions stored per run; past it they are counted, not stored.
EVENT_CEILING = 20_000
# What squid answered itself (a request it could not parse, a name that did not resolve,
# an upstream that refused): a denial that forwarded nothing, and no sign of a hijack.
NOT_FORWARDED = "not-forwarded"
# Every reason a stored decision can give (squid's own and classify's).
REASONS = frozenset(
    {
        "",
        *DENY_REASONS,
        *MODEL_REASONS,
        NOT_FORWARDED,
        *("host-not-listed", "port-not-listed", "scheme-not-allowed"),
        *("injected", "answered-by-port", "allowed", "allowed-without-matching-entry"),
    }
)
MIGRATIONS: tuple[Migration, ...] = (
    with_rowid(
        """
    CREATE TABLE egress_runs (
        run_id TEXT PRIMARY KEY,
        started TEXT NOT NULL,
        ended TEXT,
        allowlist TEXT NOT NULL,
        proxy TEXT NOT NULL DEFAULT '',
        networks TEXT NOT NULL DEFAULT '[]'
    );
    CREATE TABLE egress_events (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        time TEXT NOT NULL,
        client TEXT NOT NULL,
        method TEXT NOT NULL,
        scheme TEXT NOT NULL,
        host TEXT NOT NULL,
        port INTEGER NOT NULL,
        status INTEGER NOT NULL,
        squid_status TEXT NOT NULL,
        bytes_in INTEGER NOT NULL,
        bytes_out INTEGER NOT NULL,
        server TEXT NOT NULL,
        decision TEXT NOT NULL CHECK (decision IN ('allow', 'deny')),
        reason TEXT NOT NULL,
        entry TEXT,
        PRIMARY KEY (run_id, seq)
    );
    CREATE INDEX egress_events_decision ON egress_events(run_id, decision);
    """,
        "egress_runs",
    ),
    # The proxy port a request came in on (3128, or 3129: the credential-injecting one)
    # and its URL path without the query: model calls are counted from these.
    """
    ALTER TABLE egress_events ADD COLUMN inport INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE egress_events ADD COLUMN path TEXT NOT NULL DEFAULT '';
    """,
    # Decisions past the run's EVENT_CEILING: how many were seen (seq high-water mark)
    # and, of those not stored, how many allowed and denied.
    """
    ALTER TABLE egress_runs ADD COLUMN seen INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE egress_runs ADD COLUMN unstored_allow INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE egress_runs ADD COLUMN unstored_deny INTEGER NOT NULL DEFAULT 0;
    """,
)


@dataclass(frozen=True)
class EgressEvent:
    """One decision of the proxy. ``entry`` is the allowlist entry that matched, if any."""

    run_id: str
    seq: int
    time: str
    client: str
    method: str
    scheme: str
    host: str
    port: int
    status: int
    squid_status: str
    bytes_in: int
    bytes_out: int
    server: str
    decision: str
    reason: str
    entry: str | None
    inport: int = 0  # the proxy port the request came in on (0: not logged)
    path: str = ""  # the URL path, without its query (a query may carry a token)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def scrubbed(event: EgressEvent, scrub: Callable[[str], str]) -> EgressEvent:
    """``event`` with ``scrub`` applied to every text the request chose (a host name or a
    path may carry a credential the agent holds)."""
    return replace(
        event,
        client=scrub(event.client),
        method=scrub(event.method),
        scheme=scrub(event.scheme),
        host=scrub(event.host),
        server=scrub(event.server),
        path=scrub(event.path),
    )


# What a decision stored without its run's redactor shows for a text the agent chose.
WITHHELD = "(withheld)"
# Texts of a decision that are squid's or the host's own words, never the agent's.
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "NONE"}
)
_SCHEMES = frozenset({"http", "https", "ftp", "NONE"})
_MODEL_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
_SQUID_STATUS = re.compile(r"[A-Z_]{1,40}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def withheld(event: EgressEvent, policy: EgressPolicy) -> EgressEvent:
    """``event`` with every text the agent may have chosen replaced by ``WITHHELD``: for a
    decision stored by a process that does not hold the run's redactor (the next start's
    crash sweep, after the applying process was killed, reads a log squid wrote verbatim).

    What is kept is the host's and squid's own: the decision, the reason, the allowlist
    entry, ports, status, byte counts, the time, and a text only when it is one the
    operator or squid wrote (a host named exactly by an allowlist entry, a standard method
    or scheme, an IP address, the model-call paths of the injecting port). A registrable
    domain would not do: the agent picks the label left of a public suffix too, and a
    digest of a short value can be guessed offline, so none is kept."""

    def ip_or_withheld(text: str) -> str:
        return text if not text or is_ip_literal(text) else WITHHELD

    exact = {e.host for e in policy.entries if not e.wildcard}
    return replace(
        event,
        time=event.time if _TIME.fullmatch(event.time) else WITHHELD,
        client=ip_or_withheld(event.client),
        method=event.method if not event.method or event.method in _METHODS else WITHHELD,
        scheme=event.scheme if not event.scheme or event.scheme in _SCHEMES else WITHHELD,
        host=event.host if event.host in exact else WITHHELD,
        squid_status=(
            event.squid_status if _SQUID_STATUS.fullmatch(event.squid_status) else WITHHELD
        ),
        server=ip_or_withheld(event.server),
        reason=event.reason if event.reason in REASONS else WITHHELD,
        path=event.path if not event.path or event.path in _MODEL_PATHS else WITHHELD,
    )


def _int(text: str) -> int:
    return int(text) if text.lstrip("-").isdigit() else 0


def _time(text: str) -> str:
    try:
        moment = datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        return text
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_line(line: str) -> dict[str, str] | None:
    """The raw fields of one KAGURA1 access-log line, or None for any other line.

    A line of a proxy configured before the port and path were logged (13 fields, a
    crash sweep may read one) gets empty ones."""
    parts = line.strip().split(" ")
    if len(parts) not in (13, 15) or parts[0] != LOG_TAG:
        return None
    keys = (
        *("time", "client", "method", "scheme", "host", "port", "status", "squid_status"),
        *("bytes_in", "bytes_out", "server", "reason", "inport", "path"),
    )
    raw = dict(zip(keys, [*parts[1:], "-", "-"][: len(keys)], strict=True))
    for key in ("method", "scheme", "host", "reason", "path"):
        raw[key] = unquote(raw[key])
    raw["path"] = raw["path"].partition("?")[0]
    fields = {k: "" if v == "-" else v for k, v in raw.items()}
    if not fields["method"] and not fields["host"] and not fields["reason"]:
        return None  # a connection closed before any request: nothing was asked or decided
    return fields


def classify(raw: dict[str, str], policy: EgressPolicy, run_id: str, seq: int) -> EgressEvent:
    """Turn raw log fields into an event, naming the entry and the reason for a denial."""
    host, port = raw["host"].lower(), _int(raw["port"])
    connect = raw["method"] == "CONNECT"
    status = _int(raw["status"])
    denied = "DENIED" in raw["squid_status"] or raw["reason"] != ""
    entry = policy.match(host, port, connect)
    reason = raw["reason"]
    if not denied and status >= 400 and not raw["server"]:
        # squid answered itself with an error and reached no upstream (a request it could
        # not parse, such as an origin-form ``GET /``; a name that did not resolve): no
        # allow, nothing was forwarded.
        denied, reason = True, NOT_FORWARDED
    if denied and reason in ("", "not-allowed"):
        if is_ip_literal(host):
            reason = "ip-literal"
        elif not any(e.matches_host(host) for e in policy.entries):
            reason = "host-not-listed"
        elif not any(e.matches_host(host) and e.port == port for e in policy.entries):
            reason = "port-not-listed"
        else:
            reason = "scheme-not-allowed"
    elif not denied and raw["squid_status"] == LOCAL_KIND:
        reason = "answered-by-port"  # nothing forwarded, no credential used
    elif not denied and _int(raw["inport"]) == INJECT_PORT:
        reason = "injected"  # to the injection's upstream, the one place that port reaches
    elif not denied:
        # squid allowed it, so an entry must match; if none does, say so loudly.
        reason = "allowed" if entry else "allowed-without-matching-entry"
    return EgressEvent(
        run_id=run_id,
        seq=seq,
        time=_time(raw["time"]),
        client=raw["client"],
        method=raw["method"],
        scheme=raw["scheme"],
        host=host,
        port=port,
        status=status,
        squid_status=raw["squid_status"],
        bytes_in=_int(raw["bytes_in"]),
        bytes_out=_int(raw["bytes_out"]),
        server=raw["server"],
        decision="deny" if denied else "allow",
        reason=reason,
        entry=entry.label() if entry else None,
        inport=_int(raw["inport"]),
        path=raw["path"],
    )


def events_from_log(text: str, policy: EgressPolicy, run_id: str) -> list[EgressEvent]:
    """Every decision in a proxy's stdout, numbered by its position among KAGURA1 lines."""
    return list(events_from_lines(text.splitlines(), policy, run_id))


def events_from_lines(
    lines: Iterable[str], policy: EgressPolicy, run_id: str
) -> Iterator[EgressEvent]:
    """:func:`events_from_log` over lines, one at a time (nothing but one line in memory)."""
    seq = 0
    for line in lines:
        raw = parse_line(line)
        if raw is not None:
            yield classify(raw, policy, run_id, seq)
            seq += 1


def log_lines(chunks: Iterable[bytes], limit: int = LOG_CEILING) -> Iterator[str]:
    """The lines of a log read as ``chunks``, up to the one that crosses ``limit`` bytes.

    What is held is at most one line plus one chunk; a line longer than ``limit`` (the
    agent chooses a request's path) is cut there. Reading stops at ``limit`` even when the
    log goes on: past it the run was stopped as a flood, and the rest is not worth the
    host's memory."""
    pending, read = b"", 0
    for chunk in chunks:
        read += len(chunk)
        *whole, pending = (pending + chunk).split(b"\n")
        for line in whole:
            yield line.decode(errors="replace")
        if read >= limit:
            return
        pending = pending[:limit]
    if pending:
        yield pending.decode(errors="replace")


def batched(events: Iterable[EgressEvent], size: int = 500) -> Iterator[list[EgressEvent]]:
    """``events`` in lists of at most ``size`` (stored one transaction each)."""
    batch: list[EgressEvent] = []
    for event in events:
        batch.append(event)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def open_store(store: StateStore) -> StateStore:
    store.migrate(COMPONENT, MIGRATIONS)
    return store


def record_events(
    store: StateStore, events: Iterable[EgressEvent], ceiling: int = EVENT_CEILING
) -> list[EgressEvent]:
    """Insert the events not stored yet; return those that were new.

    An event numbered ``ceiling`` or later is not stored: it is counted in its run's row
    (once: ``seen`` is the number of decisions accounted for, so a second read of the same
    log counts nothing twice) and returned when it was new. Events of one run, in order."""
    fresh = []
    columns = list(EgressEvent.__dataclass_fields__)
    sql = (
        f"INSERT INTO egress_events ({', '.join(columns)})"
        f" VALUES ({', '.join('?' for _ in columns)}) ON CONFLICT DO NOTHING"
    )
    seen: dict[str, int] = {}
    unstored: Counter[tuple[str, str]] = Counter()
    with store.transaction() as conn:
        for event in events:
            if event.seq < ceiling:
                cursor = conn.execute(sql, [getattr(event, c) for c in columns])
                if cursor.rowcount:
                    fresh.append(event)
                continue
            if event.run_id not in seen:
                row = conn.execute(
                    "SELECT seen FROM egress_runs WHERE run_id = ?", (event.run_id,)
                ).fetchone()
                seen[event.run_id] = int(row["seen"]) if row else 0
            if event.seq >= seen[event.run_id]:
                seen[event.run_id] = event.seq + 1
                unstored[(event.run_id, event.decision)] += 1
                fresh.append(event)
        for run_id, high in seen.items():
            allowed, denied = unstored[(run_id, "allow")], unstored[(run_id, "deny")]
            conn.execute(
                "UPDATE egress_runs SET seen = ?, unstored_allow = unstored_allow + ?,"
                " unstored_deny = unstored_deny + ? WHERE run_id = ?",
                (high, allowed, denied, run_id),
            )
    return fresh


def unstored(store: StateStore, run_id: str) -> dict[str, int]:
    """The run's decisions past its ceiling, not stored: ``{"allow": n, "deny": m}``."""
    row = store.conn.execute(
        "SELECT unstored_allow, unstored_deny FROM egress_runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    return {"allow": int(row["unstored_allow"]), "deny": int(row["unstored_deny"])} if row else {}


def record_run(store: StateStore, run_id: str, started: str, allowlist: Mapping[str, Any]) -> None:
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO egress_runs (run_id, started, allowlist) VALUES (?, ?, ?)"
            " ON CONFLICT(run_id) DO UPDATE SET started = excluded.started,"
            " allowlist = excluded.allowlist, ended = NULL",
            (run_id, started, json.dumps(allowlist, sort_keys=True)),
        )


def mark_session(store: StateStore, run_id: str, how: str) -> None:
    """How the run's proxy started: ``cold``, or ``warm:<pooled session>``."""
    with store.transaction() as conn:
        conn.execute("UPDATE egress_runs SET proxy = ? WHERE run_id = ?", (how, run_id))


def run_session(store: StateStore, run_id: str) -> str:
    """``cold``, ``warm:<name>``, or '' (recorded before sessions were told apart)."""
    row = store.conn.execute("SELECT proxy FROM egress_runs WHERE run_id = ?", (run_id,)).fetchone()
    return str(row["proxy"]) if row else ""


def finish_run(store: StateStore, run_id: str, ended: str) -> None:
    with store.transaction() as conn:
        conn.execute("UPDATE egress_runs SET ended = ? WHERE run_id = ?", (ended, run_id))


def run_allowlist(store: StateStore, run_id: str) -> dict[str, Any] | None:
    row = store.conn.execute(
        "SELECT allowlist FROM egress_runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    return json.loads(row["allowlist"]) if row else None


def load_events(store: StateStore, run_id: str) -> list[EgressEvent]:
    rows = store.conn.execute(
        "SELECT * FROM egress_events WHERE run_id = ? ORDER BY seq", (run_id,)
    ).fetchall()
    return [EgressEvent(**dict(row)) for row in rows]


def latest_run(store: StateStore) -> str | None:
    row = store.conn.execute(
        "SELECT run_id FROM egress_runs ORDER BY started DESC, rowid DESC LIMIT 1"
    ).fetchone()
    return str(row["run_id"]) if row else None


def denial_summary(events: Sequence[EgressEvent]) -> list[dict[str, Any]]:
    """Denials grouped by what was tried and why, most frequent first."""
    counts = Counter((e.method, e.host, e.port, e.reason) for e in events if e.decision == "deny")
    return [
        {"method": m, "host": h, "port": p, "reason": r, "count": n}
        for (m, h, p, r), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
