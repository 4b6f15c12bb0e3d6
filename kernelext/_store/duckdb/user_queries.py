"""``kx.sql`` on the embedded store: a query nobody reviewed, checked, then run where it
cannot change anything (a READ ONLY transaction always rolled back, on a locked instance),
or, when it reads files the caller allowed, in a throw-away in-memory DuckDB."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import duckdb

from ..sql_guard import (
    Checked,
    Params,
    breach,
    check_query,
    normalize_params,
    query_error,
    query_timeout,
    runtime_refusal,
)

# The throw-away database of a query that may read files (allow_files): no extension is
# installed or loaded for it (the built-in CSV, Parquet, JSON and text readers suffice).
_FILES_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "false",
    "allow_community_extensions": "false",
}


class UserQueries:
    """The read side of ``kx.sql`` for :class:`~.backend.DuckDBConnection`: it holds the
    connection's mutex and gives each thread its cursor."""

    _mutex: threading.RLock | threading.Lock
    _cursor: Callable[[], duckdb.DuckDBPyConnection]

    def read_arrow(
        self,
        sql: str,
        params: Params = None,
        *,
        allow_files: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Run one query nobody reviewed (``kx.sql``) and return a pyarrow Table.

        ``sql_guard`` checks it with DuckDB's parser first; what runs is ``checked.sql``,
        the text that was checked (an EXPLAIN is rebuilt from its checked statement). What
        passes runs where it cannot change anything even if that check were wrong: in a
        READ ONLY transaction that is always rolled back, on a database instance whose
        settings are locked and which reaches no file, extension or other database
        (``connect.lock_down``). Only a query that the check itself found reading files (with
        ``allow_files``) runs in a throw-away in-memory DuckDB that sees copies of the
        store's tables it names (``_read_with_files``); a query the store's instance
        refuses file access is refused, never tried again elsewhere. ``timeout``: the query
        is interrupted after that many seconds (``QueryTimeout``).
        """
        checked = check_query(sql, allow_files=allow_files)
        bound = normalize_params(params)
        if allow_files and checked.reads_files:
            return self._read_with_files(checked, bound, timeout)
        with self._mutex:
            return _query_rolled_back(self._cursor(), checked.sql, bound, timeout)

    def _read_with_files(
        self,
        checked: Checked,
        params: list[Any] | dict[str, Any] | None,
        timeout: float | None = None,
    ) -> Any:
        """Run a query that reads files outside the store (the caller allowed it).

        The store's instance has external access off for good, so the query runs in a
        fresh in-memory DuckDB that may read files but installs and loads no extension;
        the store tables the query names are copied in as Arrow (a consistent snapshot,
        read in one transaction), its settings are locked and its transaction rolled back.
        It costs a copy of those tables in memory on every call.

        DuckDB cannot let an instance read files but not write them (``allowed_directories``
        admits both), so only a query the check passed runs here (no COPY, no writing
        function is on the allow-list), and the instance spills to a private temporary
        directory of its own, removed afterwards.
        """
        tables = self._export_tables(checked.tables)
        spill = tempfile.mkdtemp(prefix="kernelext-sql-")
        try:
            side = duckdb.connect(":memory:", config={**_FILES_CONFIG, "temp_directory": spill})
            try:
                for name, table in tables.items():
                    side.register(name, table)
                side.execute("SET lock_configuration = true")
                return _query_rolled_back(side, checked.sql, params, timeout)
            finally:
                side.close()
        finally:
            shutil.rmtree(spill, ignore_errors=True)

    def _export_tables(self, names: frozenset[str]) -> dict[str, Any]:
        """The store's tables among ``names``, as Arrow tables read in one transaction."""
        if not names:
            return {}
        with self._mutex:
            cur = self._cursor()
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                rows = cur.execute(
                    "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'"
                ).fetchall()
                present = {str(r[0]).lower(): str(r[0]) for r in rows}
                wanted = sorted(names & present.keys())
                return {present[n]: _whole_table(cur, present[n]) for n in wanted}
            finally:
                cur.execute("ROLLBACK")


def _query_rolled_back(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: list[Any] | dict[str, Any] | None,
    timeout: float | None = None,
) -> Any:
    """A user query as Arrow, in a READ ONLY transaction that is always rolled back;
    what the database refuses comes back as the SQL surface's one refusal.

    The third layer: DuckDB numbers transactions from one counter per database instance,
    and the caller holds the connection's mutex (no other kernelext transaction runs), so
    the first transaction after the rollback must be the next number. A larger one means
    the query started transactions of its own, on another connection and outside this
    read-only one (``json_execute_serialized_sql`` did), which may have committed: that
    raises :class:`SurfaceBreach`, loudly, whatever the query returned.
    """
    con.execute("BEGIN TRANSACTION READ ONLY")
    first = _transaction_id(con)
    alarm = _Alarm(con, timeout)
    try:
        with alarm:
            return con.sql(sql, params=params).to_arrow_table()
    except Exception as exc:
        if alarm.rang and timeout is not None:  # DuckDB's interrupt: "Query interrupted"
            raise query_timeout(timeout) from None
        if not isinstance(exc, duckdb.Error):
            raise
        refused = runtime_refusal(exc)
        if refused is None:
            raise query_error(exc) from exc
        raise refused from None
    finally:
        con.execute("ROLLBACK")
        others = _transaction_id(con) - first - 1
        if others:
            raise breach(f"ran {others} transaction(s) of its own outside its read-only one", sql)


class _Alarm:
    """Interrupt ``con``'s query after ``timeout`` seconds, only while it still runs."""

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout: float | None) -> None:
        self._con = con
        self._timeout = timeout
        self._lock = threading.Lock()
        self._running = False
        self._timer: threading.Timer | None = None
        self.rang = False

    def _ring(self) -> None:
        with self._lock:
            if self._running:
                self.rang = True
                self._con.interrupt()

    def __enter__(self) -> None:
        if self._timeout is None:
            return
        self._running = True
        self._timer = threading.Timer(self._timeout, self._ring)
        self._timer.daemon = True
        self._timer.start()

    def __exit__(self, *_: object) -> None:
        if self._timer is None:
            return
        with self._lock:
            self._running = False
        self._timer.cancel()


def _transaction_id(con: duckdb.DuckDBPyConnection) -> int:
    rows = con.execute("SELECT current_transaction_id()").fetchall()
    return int(rows[0][0]) if rows else 0


def _whole_table(cur: duckdb.DuckDBPyConnection, name: str) -> Any:
    quoted = '"' + name.replace('"', '""') + '"'
    return cur.sql(f"SELECT * FROM main.{quoted}").to_arrow_table()
