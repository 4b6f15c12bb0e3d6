"""Module-level helpers: the default store, settings, listing runs, SQL."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from ..._store import Store, default_store_path
from ..._store import open_store as _open_store
from ..._validate import check_duration, check_flag, check_store, check_store_location, check_text
from ...errors import QueryError, RunStateError, did_you_mean
from .options import OPTIONS, Option, option_named
from .runtime import get_store, runtime

__all__ = ["configure", "open_store", "runs", "sql"]


def open_store(location: str | None = None, *, read_only: bool | None = None) -> Store:
    """The store in use; with ``location`` (a DuckDB path or ``postgresql://`` URL), switch to it.

    Without an argument it returns the current store, opening the default one
    (``KERNELEXT_STORE``, else ``.kernelext/store.duckdb`` in the project) if none is open.
    ``read_only=True`` opens it for queries only (a store on a read-only mount opens that
    way by itself).
    """
    if location is not None:
        location = check_store_location("kx.open_store(location)", location)
    if read_only is not None:
        read_only = check_flag("kx.open_store(read_only=...)", read_only)
    settings = runtime().settings
    if read_only is not None:
        store = _open_store(location or default_store_path(), read_only=read_only)
        settings.use_store(None)
        settings.use_store(store)
        return store
    if location is not None:
        settings.use_store(location)
    return settings.store()


def configure(**options: Any) -> None:
    """Set options of the current runtime: the same names, values and checks as
    ``%config Kernelext.*``.

    An option left out (or ``None``) keeps its value. An unknown name raises ``TypeError``
    naming the nearest option; a value of the wrong type raises ``TypeError``, a bad value
    (a duration) ``ValueError``; nothing is changed then. ``store`` is refused
    (``RunStateError``) while runs execute here.

    The options:
    """
    settings = runtime().settings
    names = [option.name for option in OPTIONS]
    unknown = sorted(name for name in options if option_named(name) is None)
    if unknown:
        name = unknown[0]
        hint = did_you_mean(name, names)
        raise TypeError(
            f"kx.configure() has no option {name!r}.{hint} Its options (the same as "
            f"%config Kernelext.<option>): {', '.join(names)}."
        )
    checked: list[tuple[Option[Any], Any]] = []
    for option in OPTIONS:  # every value is checked before any is applied
        value = options.get(option.name)
        if value is None:
            continue
        checked.append((option, option.check(f"kx.configure({option.name}=...)", value)))
    for option, _ in checked:
        live = [h.run_id for h in runtime().live_handles()] if option.not_while_running else []
        if live:
            raise RunStateError(
                f"{option.not_while_running} while runs execute in this kernel: "
                + ", ".join(live)
                + ". Stop them first."
            )
    for option, value in checked:
        option.apply(settings, value)


def _document_configure() -> None:
    """``configure``'s signature and docstring list the declared options."""
    configure.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None)
            for option in OPTIONS
        ],
        return_annotation=None,
    )
    configure.__doc__ = (configure.__doc__ or "") + "".join(
        f"\n    - ``{option.name}``: {option.help}" for option in OPTIONS
    )


_document_configure()


def _table(arrow: Any) -> Any:
    if _has_pandas():  # the one place that decides (tests patch it to mimic no pandas)
        import pyarrow as pa

        try:
            return arrow.to_pandas()
        except ImportError:
            return arrow
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise QueryError(
                f"The query ran, but its result cannot become a pandas DataFrame ({exc}). "
                "Cast the column in the query (e.g. col::VARCHAR)."
            ) from exc
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
    timeout: float | None = None,
    store: Store | None = None,
) -> Any:
    """Run one read-only query on the store: a DataFrame with pandas, else a pyarrow Table.

    ``params`` are bound, never pasted into the text: a sequence for ``?`` (or ``$1``), a
    mapping for ``$name``. Files outside the store (``read_csv``, ``glob``, ``FROM
    'data.parquet'``) are read only with ``allow_files=True``. A query that would write,
    change a setting, advance a sequence or touch a file raises ``ReadOnlyError``, which
    says what to do instead; one the database cannot run (an unknown table, a syntax
    error) raises ``QueryError`` with the database's message. ``timeout`` (seconds): a
    query still running then is interrupted and raises ``QueryTimeout`` (on DuckDB it
    holds the store's connection while it runs, so the agents of this process wait to
    write until it ends).
    """
    if not isinstance(query, str):  # an empty one is refused by the guard, like any other
        raise TypeError(f"kx.sql(query) takes one SQL query as a str, not {type(query).__name__}.")
    if params is not None and (
        isinstance(params, (str, bytes)) or not isinstance(params, (Sequence, Mapping))
    ):
        raise TypeError(
            "kx.sql(query, params=...) takes a sequence (a list or tuple) of values for ? (or "
            f"$1), or a dict for $name, not {type(params).__name__} {params!r}."
        )
    allow_files = check_flag("kx.sql(allow_files=...)", allow_files)
    if timeout is not None:
        timeout = check_duration("kx.sql(timeout=...)", timeout)
    check_store("kx.sql(store=...)", store)
    table = get_store(store).read_arrow(
        query, params, allow_files=allow_files, **({"timeout": timeout} if timeout else {})
    )
    frame = _table(table)
    if type(frame).__module__.startswith("pandas"):
        from .runs_frame import shown_table  # pandas is imported only where it is installed

        return shown_table(frame)
    return frame


def runs(status: str | None = None, *, store: Store | None = None) -> Any:
    """The runs in the store (newest last), optionally only those in ``status``.

    A pandas DataFrame (a pyarrow Table without pandas), one row a run: ``id``, ``agent``,
    ``status``, ``reason``, ``completed_steps``, ``total_steps``, ``created_at``,
    ``updated_at``, ``deadline``, ``parent_id``. Shown as the last expression of a notebook
    cell with ``%load_ext kernelext`` loaded, it is the live overview of those runs: each
    run's status, progress, time left or the pending stop's estimate, what it waits for
    (an approval, an answer, a decision, its deadline), Stop and Force stop buttons that
    work while the kernel is busy, and a button that opens the run's panel. Frames derived
    from it (``.head()``, a filter) are plain DataFrames and display as tables.
    """
    if status is not None:
        from ...status import Status

        check_text("kx.runs(status)", status, what="a run status (a str)")
        if status not in {str(s) for s in Status}:
            from ..._did_you_mean import did_you_mean

            raise ValueError(
                f"kx.runs(status) takes a run status, not {status!r}."
                + did_you_mean(status, [str(s) for s in Status])
                + " Statuses: "
                + ", ".join(str(s) for s in Status)
                + "."
            )
    check_store("kx.runs(store=...)", store)
    used = get_store(store)
    table = _table(used.runs_table(status))
    if type(table).__module__.startswith("pandas"):  # displayed live in a notebook
        from .runs_frame import runs_frame

        return runs_frame(table, store=used, status=status)
    return table
