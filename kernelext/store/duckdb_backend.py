"""The embedded DuckDB backend: one file, one long-lived write connection."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import duckdb

from ..errors import ReadOnlyError, StoreError, StoreLockedError
from .writer import Tx

__all__ = ["DuckDBConnection", "open_duckdb"]

_PID = re.compile(r"\(PID (\d+)\)")
_UMASK_LOCK = threading.Lock()


class _DuckTx:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._con.execute(sql, list(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._con.executemany(sql, [list(r) for r in rows])

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._con.execute(sql, list(params)).fetchone()

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._con.execute(sql, list(params)).fetchall()


class DuckDBConnection:
    """Adapter the writer thread drives; reads use per-thread cursors."""

    dialect = "duckdb"

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str) -> None:
        self.con = con
        self.path = path
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._cursor_lock = threading.Lock()

    def begin(self) -> Tx:
        self.con.execute("BEGIN TRANSACTION")
        return _DuckTx(self.con)

    def commit(self) -> None:
        self.con.execute("COMMIT")

    def rollback(self) -> None:
        self.con.execute("ROLLBACK")

    def reader(self) -> duckdb.DuckDBPyConnection:
        """A cursor for the calling thread; it sees committed data only."""
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self.con.cursor()
            self._local.cursor = cur
            with self._cursor_lock:
                self._cursors.append(cur)
        return cur

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.reader().execute(sql, list(params)).fetchall()

    def read_with_names(
        self, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        cur = self.reader().execute(sql, list(params))
        names = [d[0] for d in (cur.description or [])]
        return cur.fetchall(), names

    def read_arrow(self, sql: str) -> Any:
        """Run one read-only statement and return a pyarrow Table."""
        kinds = [s.type for s in duckdb.extract_statements(sql)]
        allowed = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
        if len(kinds) != 1 or kinds[0] not in allowed:
            names = ", ".join(k.name for k in kinds) or "nothing"
            raise ReadOnlyError(
                f"kx.sql is read-only and takes one SELECT statement; this is {names}. "
                "Change runs through the kernelext API (kx.resume, kx.reconcile, ...)."
            )
        cur = self.reader()
        cur.execute("BEGIN TRANSACTION")
        try:
            return cur.sql(sql).to_arrow_table()
        finally:
            cur.execute("ROLLBACK")

    def close(self) -> None:
        with self._cursor_lock:
            for cur in self._cursors:
                with contextlib.suppress(duckdb.Error):
                    cur.close()
            self._cursors.clear()
        self.con.close()


def open_duckdb(path: str) -> DuckDBConnection:
    """Open (or create, mode 0600) the store file, turning lock errors into advice."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"Cannot create the folder for the kernelext store {path!r}: {exc}"
        ) from None
    try:
        with _UMASK_LOCK:
            old = os.umask(0o077)
            try:
                con = duckdb.connect(path)
            finally:
                os.umask(old)
    except duckdb.IOException as exc:
        msg = str(exc)
        if "Could not set lock" in msg or "Conflicting lock" in msg:
            match = _PID.search(msg)
            raise StoreLockedError(path, int(match.group(1)) if match else None) from None
        raise StoreError(f"Cannot open the kernelext store {path!r}: {msg}") from None
    except duckdb.Error as exc:
        raise StoreError(
            f"Cannot open the kernelext store {path!r}: {exc}. If the file is not a kernelext "
            "store, point KERNELEXT_STORE at another path."
        ) from None
    for suffix in ("", ".wal"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path + suffix, 0o600)
    return DuckDBConnection(con, path)
