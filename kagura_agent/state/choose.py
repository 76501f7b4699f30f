"""Choosing the state store: which location a command opens, and opening it.

Apart from opening (state/store.py takes a location and reads nothing else), as
Terraform keeps its backend configuration apart from its state manager. Every command
chooses the same way, so ``leases``, ``graduation``, ``runner`` and ``queue`` see the
ledger ``apply`` wrote:

1. ``KAGURA_AGENT_STATE_URL`` (a ``postgresql://`` URL), when set;
2. else the URL the operator folder's ``State`` manifest names (manifest/statebackend.py),
   unless that manifest is a file a run's agent could have written (run history,
   state/history.py, read from this host's own store in the state directory);
3. else ``state.db`` in the state directory (``KAGURA_AGENT_STATE_DIR``).

``open_store()`` / ``open_store_read_only()`` open the chosen store; a store that cannot
be reached says who chose it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kagura_agent.manifest import statebackend
from kagura_agent.paths import state_dir
from kagura_agent.state.history import refuse_written
from kagura_agent.state.store import Location, StateStore, checked_url
from kagura_agent.state.types import StateDbError

STATE_FILE = "state.db"
URL_ENV = "KAGURA_AGENT_STATE_URL"


def state_path() -> Path:
    """Where state.db is: the state directory's (``KAGURA_AGENT_STATE_DIR``)."""
    return state_dir() / STATE_FILE


def state_location() -> Location:
    """The configured store: ``KAGURA_AGENT_STATE_URL`` when set, else the URL the
    operator folder's State manifest names, else state.db in the state directory."""
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        return checked_url(url, said_by=URL_ENV)
    chosen = _manifest_choice()
    return chosen.url if chosen is not None else state_path()


def state_origin() -> str:
    """Who chose the configured store, for messages."""
    if os.environ.get(URL_ENV, "").strip():
        return URL_ENV
    chosen = _manifest_choice()
    return chosen.origin() if chosen is not None else "the state directory"


def open_store(where: Location | None = None) -> StateStore:
    """The store at ``where``, or the configured one (``state_location``), opened for
    writing (created and migrated as its components ask)."""
    if where is not None:
        return StateStore(where)
    location = state_location()
    with _said_who_chose(location):
        return StateStore(location)


def open_store_read_only(where: Location | None = None) -> StateStore | None:
    """``StateStore.read_only`` on ``where``, or on the configured store."""
    if where is not None:
        return StateStore.read_only(where)
    location = state_location()
    with _said_who_chose(location):
        return StateStore.read_only(location)


@contextmanager
def _said_who_chose(location: Location) -> Iterator[None]:
    """A configured PostgreSQL store that cannot be reached: the error says who chose it."""
    try:
        yield
    except StateDbError as exc:
        if isinstance(location, Path):
            raise
        raise StateDbError(
            f"{exc} (chosen by {state_origin()})",
            hint=f"check the database is up and reachable, or unset {URL_ENV} / remove the"
            " State manifest to use the embedded store",
        ) from exc


_choices: dict[str, statebackend.StateChoice | None] = {}


def _manifest_choice() -> statebackend.StateChoice | None:
    """The State manifest's choice (read once per folder and process)."""
    folder = str(statebackend.folder().resolve())
    if folder not in _choices:
        chosen = statebackend.choose(Path(folder))
        if chosen is not None:
            _refuse_written_choice(chosen)
        _choices[folder] = chosen
    return _choices[folder]


def _refuse_written_choice(chosen: statebackend.StateChoice) -> None:
    """A State manifest a run's agent could have written chooses no store.

    The store holds the authority (graduation, approvals, the lease ledger), and the run
    history that says which files an agent could have written is in a store: the one
    this choice would open knows nothing of it (the agent's own database, say). So the
    choice is checked against this host's own store in the state directory, where every
    run that did not choose another store is recorded."""
    if state_path().is_file():
        refuse_written(f"the state store choice of {chosen.origin()}", chosen.reads, state_path())
