"""Module-level helpers: the default store, listing runs, SQL, stopping by id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..store import Store, default_store_path
from ..store import open_store as _open_store
from .engine import request_stop
from .registry import live_handle
from .settings import SETTINGS, get_store

__all__ = ["configure", "open_store", "runs", "sql", "stop"]


def open_store(location: str | None = None, *, read_only: bool | None = None) -> Store:
    """The store in use; with ``location`` (a DuckDB path or ``postgresql://`` URL), switch to it.

    Without an argument it returns the current store, opening the default one
    (``KERNELEXT_STORE``, else ``.kernelext/store.duckdb`` in the project) if none is open.
    ``read_only=True`` opens it for queries only (a store on a read-only mount opens that
    way by itself).
    """
    if read_only is not None:
        store = _open_store(location or default_store_path(), read_only=read_only)
        SETTINGS.use_store(None)
        SETTINGS.use_store(store)
        return store
    if location is not None:
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
    if _has_pandas():  # the one place that decides (tests patch it to mimic no pandas)
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


def sql(
    query: str,
    params: Sequence[Any] | Mapping[str, Any] | None = None,
    *,
    allow_files: bool = False,
    store: Store | None = None,
) -> Any:
    """Run one read-only query on the store: a DataFrame with pandas, else a pyarrow Table.

    ``params`` are bound, never pasted into the text: a sequence for ``?`` (or ``$1``), a
    mapping for ``$name``. Files outside the store (``read_csv``, ``glob``, ``FROM
    'data.parquet'``) are read only with ``allow_files=True``. A query that would write,
    change a setting, advance a sequence or touch a file raises ``ReadOnlyError``, which
    says what to do instead.
    """
    return _table(get_store(store).read_arrow(query, params, allow_files=allow_files))


def runs(status: str | None = None, *, store: Store | None = None) -> Any:
    """The runs in the store (newest last), optionally only those in ``status``."""
    return _table(get_store(store).runs_table(status))


def stop(run_id: str, *, source: str = "api", store: Store | None = None) -> str:
    """Ask run ``run_id`` to stop at its next safe point; the request is recorded at once.

    A run live in this process is stopped in its own store; any other run is looked up in
    ``store`` (default: the current store), and its owner sees the request at its next
    safe point, whichever process that is.
    """
    if store is None:
        live = live_handle(run_id)
        if live is not None:
            store = live.store
    return request_stop(get_store(store), run_id, source=source)
