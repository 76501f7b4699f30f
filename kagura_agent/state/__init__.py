"""The state store: applied plans, approvals, the lease ledger, sessions, graduation, runs.

    store.py    opening a store at a location passed in (SQLite file or PostgreSQL URL)
    sqlite.py   the embedded backend          pg.py   PostgreSQL (team mode)
    sql.py      the SQL both dialects read    types.py  what components see of a connection
    choose.py   which store a command opens (environment, State manifest, state directory)
    history.py  run history: the runs table, what was written while an agent could write

The package imports nothing above it (tests/test_import_graph.py): the lowest layers it
reads are the error tree, paths, the clock and the State manifest's own reader.
"""

from kagura_agent.state.choose import (
    STATE_FILE,
    URL_ENV,
    open_store,
    open_store_read_only,
    state_location,
    state_origin,
    state_path,
)
from kagura_agent.state.history import refuse_written
from kagura_agent.state.store import Location, SchemaBehind, StateStore, describe, owner_key
from kagura_agent.state.types import Connection, MissingTable, StateDbError

__all__ = [
    "STATE_FILE",
    "URL_ENV",
    "Connection",
    "Location",
    "MissingTable",
    "SchemaBehind",
    "StateDbError",
    "StateStore",
    "describe",
    "open_store",
    "open_store_read_only",
    "owner_key",
    "refuse_written",
    "state_location",
    "state_origin",
    "state_path",
]
