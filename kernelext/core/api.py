"""Module-level helpers: the default store, listing runs, SQL, stopping by id."""

from __future__ import annotations

import sys
from typing import Any

from ..store import Store
from .engine import request_stop
from .settings import SETTINGS, get_store

__all__ = ["configure", "open_store", "runs", "sql", "stop"]


def open_store(location: str | None = None) -> Store:
    """Use the store at ``location`` (a DuckDB path or ``postgresql://`` URL) from now on."""
    SETTINGS.use_store(location)
    return SETTINGS.store()


def configure(
    *,
    store: str | None = None,
    expiry: dict[str, Any] | None = None,
    retention_seconds: float | None = None,
    check_timeout: float | None = None,
) -> None:
    """Set process-wide options (the same ones as ``%config Kernelext.*``)."""
    if store is not None:
        SETTINGS.use_store(store)
    if expiry is not None:
        SETTINGS.expiry.update(expiry)
    if retention_seconds is not None:
        SETTINGS.retention_seconds = float(retention_seconds)
    if check_timeout is not None:
        SETTINGS.check_timeout = float(check_timeout)


def _table(arrow: Any) -> Any:
    if "pandas" in sys.modules or _has_pandas():
        try:
            return arrow.to_pandas()
        except ImportError:
            return arrow
    return arrow


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def sql(query: str, *, store: Store | None = None) -> Any:
    """Run a read-only query on the store: a DataFrame with pandas, else a pyarrow Table."""
    return _table(get_store(store).backend.read_arrow(query))


def runs(status: str | None = None, *, store: Store | None = None) -> Any:
    """The runs in the store (newest last), optionally only those in ``status``."""
    where = " WHERE status = ?" if status else ""
    query = (
        "SELECT id, agent, status, reason, completed_steps, total_steps, created_at, updated_at,"
        f" deadline, parent_id FROM runs{where} ORDER BY created_at"
    )
    store = get_store(store)
    if status:
        query = query.replace("status = ?", "status = " + _quote(status))
    return _table(store.backend.read_arrow(query))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def stop(run_id: str, *, source: str = "api", store: Store | None = None) -> str:
    """Ask run ``run_id`` to stop at its next safe point; the request is recorded at once."""
    return request_stop(get_store(store), run_id, source=source)
