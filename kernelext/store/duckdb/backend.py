"""The embedded DuckDB backend: one file, one long-lived write connection."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from ...errors import ReadOnlyError, StoreError, StoreLockedError
from ..base import Backend
from ..writer import Tx, Writer
from .handoff import HandoffLock
from .hot_path import JournalHotPath
from .recovery import fold_orphaned_journals
from .side_files import SideFiles

__all__ = ["DuckDBConnection", "open_duckdb"]

INLINE_LIMIT = 64 << 10  # payloads above 64 KiB go to a side file, off the commit path
_PID = re.compile(r"\(PID (\d+)\)")
# EXPLAIN ANALYZE executes its statement (a COPY TO would write a file), and a sequence
# moves on even when the transaction around it is rolled back.
_EXPLAIN = re.compile(r"^\s*explain(\s+analy[sz]e)?\b", re.IGNORECASE)
_SEQUENCE_WRITE = re.compile(r"\b(nextval|setval)\s*\(", re.IGNORECASE)
_UMASK_LOCK = threading.Lock()
# Failures that the same records would meet again: the tables refuse them.
_PERMANENT = (
    duckdb.ConstraintException,
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.TypeMismatchException,
    duckdb.OutOfRangeException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ParserException,
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
)
# New store files get 16 KiB blocks instead of 256 KiB: a store is many small tables, and
# every table and index costs at least a block. (An existing file keeps its block size.)
# Another connection to the same file in this process must pass the same config.
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {"default_block_size": "16384"}


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


class DuckDBConnection(Backend):
    """The store's connection, opened while this process holds the store file.

    The writer thread drives transactions; reads from any thread use a per-thread
    cursor. Between group commits the connection is handed to another process that
    waits for it (see ``handoff``), and it is let go after ``linger`` idle seconds.
    """

    dialect = "duckdb"
    inline_limit = INLINE_LIMIT
    foreign_if_any_table = True  # a store file is kernelext's alone
    tick = 0.05
    min_hold = 0.25  # seconds a process keeps the file once it opened it, if busy

    def __init__(
        self,
        path: str,
        *,
        wait_timeout: float = 30.0,
        linger: float = 1.0,
        read_only: bool = False,
    ) -> None:
        self.path = path
        self.wait_timeout = wait_timeout
        self.linger = linger
        self.read_only = read_only
        self.lock = HandoffLock(path, read_only=read_only)
        self.side_files = SideFiles(path)
        self.con: duckdb.DuckDBPyConnection | None = None
        self.opens = 0
        self.now: Callable[[], dt.datetime] = _utcnow
        self.hot_path: JournalHotPath | None = None
        self.closed = False
        self._opened_at = 0.0
        self._mutex = threading.RLock()
        self._in_tx = False
        self._local = threading.local()
        self._generation = 0
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._last_used = time.monotonic()

    # -- opening and handing over ----------------------------------------------------
    def _open(self) -> duckdb.DuckDBPyConnection:
        if self.closed:
            raise StoreError(
                f"The kernelext store {self.path!r} was closed. Open it again with "
                "kx.open_store(path)."
            )
        if self.con is None:
            self.lock.acquire(self.wait_timeout)
            try:
                self.con = _connect(self.path, self.wait_timeout, read_only=self.read_only)
            except BaseException:
                self.lock.release()
                raise
            try:
                if not self.read_only:
                    self._fold_journals(self.con)
            except BaseException:
                self.con.close()
                self.con = None
                self.lock.release()
                raise
            self.opens += 1
            self._opened_at = time.monotonic()
            if self.on_open is not None and not self._in_tx:
                self.on_open()
        self._last_used = time.monotonic()
        return self.con

    def _fold_journals(self, con: duckdb.DuckDBPyConnection) -> None:
        """Fold the journals of processes that died (each in its own transactions, so
        one bad record never blocks the others)."""

        def run_tx(job: Callable[[Tx], Any]) -> Any:
            con.execute("BEGIN TRANSACTION")
            try:
                result = job(_DuckTx(con))
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            return result

        own = self.hot_path.path if self.hot_path is not None else None
        fold_orphaned_journals(run_tx, self.path, own, now=self.now, is_permanent=self.is_permanent)

    def open_hot_path(self, writer: Writer) -> JournalHotPath:
        """This process's journal: hot-path records are durable after one fdatasync."""
        self.hot_path = JournalHotPath(
            self.path, writer, is_permanent=self.is_permanent, now=self.now
        )
        return self.hot_path

    def _release(self, *, handing_over: bool = False) -> None:
        if self.con is None:
            return
        for cur in self._cursors:
            with contextlib.suppress(duckdb.Error):
                cur.close()
        self._cursors.clear()
        self._generation += 1
        con, self.con = self.con, None
        try:
            con.close()
        finally:
            self.lock.release(handing_over=handing_over)

    def idle_tick(self) -> float | None:
        """Called by the writer when idle; returns how long it may sleep."""
        with self._mutex:
            if self.con is None or self._in_tx:
                return None if self.con is None else self.tick
            now = time.monotonic()
            idle = now - self._last_used
            held = now - self._opened_at
            if held >= self.min_hold and self.lock.others_waiting():
                self._release(handing_over=True)
                return None
            if idle >= self.linger:
                self._release()
                return None
            return self.tick

    def after_batch(self) -> None:
        with self._mutex:
            held = time.monotonic() - self._opened_at
            if (
                self.con is not None
                and not self._in_tx
                and held >= self.min_hold
                and self.lock.others_waiting()
            ):
                self._release(handing_over=True)

    # -- transactions (writer thread) -------------------------------------------------
    def begin(self) -> Tx:
        self._mutex.acquire()
        try:
            con = self._open()
            con.execute("BEGIN TRANSACTION")
        except BaseException:
            self._mutex.release()
            raise
        self._in_tx = True
        return _DuckTx(con)

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        self._end("ROLLBACK")

    def _end(self, statement: str) -> None:
        if not self._in_tx:
            return
        try:
            assert self.con is not None
            try:
                self.con.execute(statement)
            except duckdb.Error as exc:
                if statement == "ROLLBACK" and "no transaction is active" in str(exc):
                    return  # a failed COMMIT already rolled back
                if statement == "ROLLBACK":
                    # A connection that cannot roll back (DuckDB invalidates the database
                    # after a fatal error) is closed; the next job opens it again.
                    self._release()
                    return
                raise
            if not self.read_only:
                _private_wal(self.path)
        finally:
            self._in_tx = False
            self._last_used = time.monotonic()
            self._mutex.release()

    def is_permanent(self, exc: BaseException) -> bool:
        """Would this failure happen again with the same records (the tables refuse them)?

        Disk full, out of memory, I/O errors and a busy file are transient: retried.
        """
        return isinstance(exc, _PERMANENT)

    # -- reads (any thread) --------------------------------------------------------------
    def _cursor(self) -> duckdb.DuckDBPyConnection:
        con = self._open()
        cached = getattr(self._local, "cursor", None)
        if cached is not None and cached[0] == self._generation:
            cur: duckdb.DuckDBPyConnection = cached[1]
            return cur
        cur = con.cursor()
        self._local.cursor = (self._generation, cur)
        self._cursors.append(cur)
        return cur

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._mutex:
            return self._cursor().execute(sql, list(params)).fetchall()

    def try_read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]] | None:
        """Like ``read``, but ``None`` at once when the store is busy or handed over."""
        if not self._mutex.acquire(blocking=False):
            return None
        try:
            if self.con is None:
                return None
            return self._cursor().execute(sql, list(params)).fetchall()
        finally:
            self._mutex.release()

    def read_with_names(
        self, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        with self._mutex:
            cur = self._cursor().execute(sql, list(params))
            names = [d[0] for d in (cur.description or [])]
            return cur.fetchall(), names

    def read_arrow(self, sql: str) -> Any:
        """Run one read-only statement and return a pyarrow Table."""
        kinds = [s.type for s in duckdb.extract_statements(sql)]
        allowed = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
        if kinds == [duckdb.StatementType.EXPLAIN]:
            inner = duckdb.extract_statements(_EXPLAIN.sub("", sql, count=1))
            kinds = [s.type for s in inner]
        if len(kinds) != 1 or kinds[0] not in allowed:
            names = ", ".join(k.name for k in kinds) or "nothing"
            raise ReadOnlyError(
                f"kx.sql is read-only and takes one SELECT statement; this is {names}. "
                "Change runs through the kernelext API (kx.resume, kx.reconcile, ...)."
            )
        if _SEQUENCE_WRITE.search(sql):
            raise ReadOnlyError(
                "kx.sql is read-only: nextval()/setval() advance a sequence of the store."
            )
        with self._mutex:
            cur = self._cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                return cur.sql(sql).to_arrow_table()
            finally:
                cur.execute("ROLLBACK")

    def close(self) -> None:
        with self._mutex:
            self.closed = True
            try:
                self._release()
            finally:
                self.lock.close()


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _connect(path: str, timeout: float, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Connect (creating the file with mode 0600); wait out a foreign holder up to ``timeout``.

    A file written by a newer kernelext, or someone else's DuckDB file, is refused here,
    on every connect, before anything writes to it.
    """
    from ..compat import check_store

    deadline = time.monotonic() + timeout
    while True:
        try:
            with _UMASK_LOCK:
                old = os.umask(0o077)
                try:
                    con = duckdb.connect(path, read_only=read_only, config=DUCKDB_CONFIG)
                finally:
                    os.umask(old)
        except duckdb.IOException as exc:
            msg = str(exc)
            if "Could not set lock" not in msg and "Conflicting lock" not in msg:
                raise StoreError(f"Cannot open the kernelext store {path!r}: {msg}") from None
            if time.monotonic() >= deadline:
                match = _PID.search(msg)
                raise StoreLockedError(path, int(match.group(1)) if match else None) from None
            time.sleep(0.05)
            continue
        except duckdb.Error as exc:
            raise StoreError(
                f"Cannot open the kernelext store {path!r}: {exc}. If the file is not a "
                "kernelext store, point KERNELEXT_STORE at another path."
            ) from None
        try:  # before anything touches the file: the journal fold, chmod, the WAL
            check_store(_DuckTx(con).fetchall, path, True)
        except BaseException:
            con.close()
            raise
        # Store statements are tiny: one thread avoids DuckDB's per-statement scheduling
        # cost (about half of a small insert here); analytics over a million rows stay fast.
        con.execute("SET threads = 1")
        if read_only:
            return con
        for suffix in ("", ".wal"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(path + suffix, 0o600)
        _private_wal(path)
        return con


def _private_wal(path: str) -> None:
    """Make sure the WAL exists with mode 0600 before DuckDB writes records into it.

    DuckDB deletes the WAL at every checkpoint and creates it again on the next write
    with the process umask (often 0644): the records would be readable by every user.
    An empty WAL that DuckDB finds is used as it is (and removed on open).
    """
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path + ".wal", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def open_duckdb(
    path: str, *, wait_timeout: float | None = None, read_only: bool | None = None
) -> DuckDBConnection:
    """The DuckDB backend for ``path`` (created with mode 0600 on first use).

    ``read_only=None`` opens read-only when the store's folder or file cannot be written
    (a read-only mount, a folder of someone else's): reads work, writes are refused
    with a clear error. ``True`` asks for it, ``False`` refuses a read-only folder.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    writable = _writable(path)
    if read_only is None:
        read_only = not writable and os.path.exists(path)
    if not read_only:
        if not writable:
            raise StoreError(
                f"The kernelext store {path!r} cannot be written: its folder (or the file) is "
                "read-only. Open it with kx.open_store(path, read_only=True) to read it, or "
                "point KERNELEXT_STORE at a writable folder to run agents."
            )
        try:
            os.makedirs(parent, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"Cannot create the folder for the kernelext store {path!r}: {exc}"
            ) from None
    elif not os.path.exists(path):
        raise StoreError(f"There is no kernelext store at {path!r} to open read-only.")
    if wait_timeout is None:
        wait_timeout = float(os.environ.get("KERNELEXT_STORE_WAIT", "30"))
    return DuckDBConnection(path, wait_timeout=wait_timeout, read_only=read_only)


def _writable(path: str) -> bool:
    """Can this process create the store's files beside ``path`` (and write the file)?"""
    folder = os.path.dirname(path)
    while not os.path.isdir(folder):  # the folder is created: look at the nearest parent
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    return not os.path.exists(path) or os.access(path, os.W_OK)
