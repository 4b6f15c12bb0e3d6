"""The embedded DuckDB backend: one file, one long-lived write connection."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from ..._validate import store_path_problem
from ...errors import StoreError
from ..base import Backend
from ..records import FENCED
from ..writer import Tx, Writer
from .bulk import apply_records
from .checkpoint import checkpoint, undo_before_open, wal_is_full
from .connect import (
    DUCKDB_CONFIG,
    PERMANENT_ERRORS,
    DuckTx,
    connect_file,
    duckdb_config,
    file_identity,
    file_signal,
    is_writable,
    open_header,
    private_wal,
)
from .fence import FenceFiles, foreign_records
from .file_guard import FileGuard
from .handoff import HandoffLock
from .hot_path import JournalHotPath
from .mailbox import ForeignStops, Posted, post_when_busy
from .recovery import fold_orphaned_journals
from .side_files import SideFiles
from .store_files import (
    check_store_owner,
    check_store_path,
    private_dirs,
)
from .user_queries import UserQueries

__all__ = ["DUCKDB_CONFIG", "DuckDBConnection", "duckdb_config", "open_duckdb"]

_log = logging.getLogger("kernelext")
INLINE_LIMIT = 64 << 10  # payloads above 64 KiB go to a side file, off the commit path


class DuckDBConnection(FileGuard, UserQueries, Backend):
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
        self.side_files = SideFiles(path, read_only=read_only)
        self.fence = None if read_only else FenceFiles(path)
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
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._size_seen = 0  # st_size after this process's last commit (while it holds it)
        self._header_seen = False  # the file has shown DuckDB's magic bytes at this identity
        # The store file's header is read through this descriptor, opened after connecting
        # and closed before the hand-over lock is let go: closing any descriptor of a file
        # drops every POSIX lock this process holds on it, DuckDB's own lock included, so
        # the file is never opened and closed while a connection to it is open.
        self._header_fd: int | None = None
        self.lost: str | None = None  # why the store file can no longer be written, once known
        self._opening = False  # a thread waits for its turn at the file (``waiting_for_file``)

    # -- opening and handing over ----------------------------------------------------
    def _open(self) -> duckdb.DuckDBPyConnection:
        if self.closed:
            raise StoreError(
                f"The kernelext store {self.path!r} was closed. Open it again with "
                "kx.open_store(path)."
            )
        if self.con is None:
            self._check_file()  # before connecting: a file gone would be created anew
            self._opening = True
            try:
                self.lock.acquire(self.wait_timeout)
            finally:
                self._opening = False
            try:
                if not self.read_only:  # our turn: the header is read, and kept open
                    self._header_fd = open_header(self.path)
                    self._check_file()  # replaced or rewritten while we waited our turn
                undo_before_open(self.path, read_only=self.read_only, fd=self._header_fd)
                self._opening = True  # a DuckDB connection of another program may hold it
                try:
                    self.con = connect_file(self.path, self.wait_timeout, read_only=self.read_only)
                finally:
                    self._opening = False
                if self._identity is None:
                    self._identity = file_identity(self.path)
                if self._header_fd is None and not self.read_only:  # DuckDB just made it
                    self._header_fd = open_header(self.path)
                self._check_file()  # replaced while this process waited for its turn
            except BaseException:
                if self.con is not None:
                    with contextlib.suppress(duckdb.Error):
                        self.con.close()
                    self.con = None
                self._close_header()
                self.lock.release()
                raise
            try:
                if not self.read_only:
                    self._fold_journals(self.con)
            except BaseException:
                self.con.close()
                self.con = None
                self._close_header()
                self.lock.release()
                raise
            self.opens += 1
            self._opened_at = time.monotonic()
            if self.on_open is not None and not self._in_tx:
                self.on_open()
        self._last_used = time.monotonic()
        return self.con

    def _checkpoint(self) -> None:
        """Move the WAL into the file (undoably). A failure keeps the WAL, and the copy of
        the blocks for the next open; the connection is let go (DuckDB may have
        invalidated it)."""
        if self.con is None or self.read_only or self._header_fd is None:
            return
        try:
            checkpoint(self.con, self.path, self._header_fd)
        except (duckdb.Error, OSError, StoreError):
            _log.warning("checkpoint of the kernelext store %r failed", self.path, exc_info=True)
            self._release(checkpointed=True)

    def _fold_journals(self, con: duckdb.DuckDBPyConnection) -> None:
        """Fold the journals of processes that died (each in its own transactions, so
        one bad record never blocks the others)."""

        def run_tx(job: Callable[[Tx], Any]) -> Any:
            con.execute("BEGIN TRANSACTION")
            try:
                result = job(DuckTx(con))
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
            self.path,
            writer,
            is_permanent=self.is_permanent,
            now=self.now,
            lost=self._lost,
            waiting=self.waiting_for_file,
        )
        return self.hot_path

    def post_stop_when_busy(self, data: dict[str, Any], *, epoch: int | None) -> Posted | None:
        """A stop request journaled aside while another process keeps the file (``mailbox``)."""
        return post_when_busy(self, data, epoch=epoch)

    def foreign_stops(self) -> ForeignStops:
        """A reader of the stop requests other processes posted beside the store."""
        return ForeignStops(self.path, self.hot_path.path if self.hot_path is not None else None)

    def waiting_for_file(self) -> bool:
        """A thread of this process waits for its turn at the store file (another process
        holds it, or hands it over): a fold queued now waits for that process."""
        return self._opening

    def change_signal(self) -> tuple[Any, ...]:
        """The store file's and its WAL's (inode, size, mtime): every commit, this
        process's or another's, appends to the WAL or rewrites the file at a checkpoint;
        reads change neither (an empty WAL counts as none)."""
        return tuple(file_signal(p) for p in (self.path, self.path + ".wal"))

    # -- the store file replaced or deleted under this process ----------------------------
    def _lost(self) -> str | None:
        return self.lost

    def fold_foreign_tx(self, tx: Tx, run_id: str, *, ends: bool = False) -> None:
        """What previous owners journaled for ``run_id`` (journal files of live processes
        included) is folded, under their epoch, before the take-over reads the run. What
        the fold refuses there is kept by the journal's own process when it folds it.

        ``ends``: their ``run_end`` records too, and the stop requests before them. A
        take-over folds once with them before it looks at the run's status (a run its
        owner suspended, whose record waits for the file, is seen suspended), and once
        without them after its move: an end (or a stop) journaled in between must not
        undo the move; the end's own process finds it stale."""
        own = self.hot_path.path if self.hot_path is not None else None
        kinds = (*FENCED, "stop_request") if ends else tuple(k for k in FENCED if k != "run_end")
        for journal_id, records in foreign_records(self.path, own, run_id, kinds):
            row = tx.fetchone(
                "SELECT last_seq FROM journal_state WHERE journal_id = ?", (journal_id,)
            )
            folded = int(row[0]) if row is not None else 0
            unfolded = [r for r in records if r[0] > folded]
            if unfolded:
                apply_records(tx, unfolded)
        if self.hot_path is not None:  # a take-over made here: this process's own records
            self.hot_path.folder.fold_in(tx)

    def _release(self, *, handing_over: bool = False, checkpointed: bool = False) -> None:
        if self.con is None:
            return
        if not checkpointed:
            self._checkpoint()  # closing does not: DuckDB's own is not undoable
            if self.con is None:
                return
        for cur in self._cursors:
            with contextlib.suppress(duckdb.Error):
                cur.close()
        self._cursors.clear()
        self._generation += 1
        con, self.con = self.con, None
        self._size_seen = 0  # another process may write (and shrink) it before we are back
        try:
            con.close()
        finally:
            self._close_header()  # after DuckDB let go of the file, before the next may take it
            self.lock.release(handing_over=handing_over)

    def _close_header(self) -> None:
        fd, self._header_fd = self._header_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

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
            self._check_file()
            con.execute("BEGIN TRANSACTION")
        except BaseException:
            self._mutex.release()
            raise
        self._in_tx = True
        return DuckTx(con)

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
                    self._release(checkpointed=True)
                    return
                raise
            if not self.read_only:
                if statement == "COMMIT":
                    self._check_file_at(committed=True)  # committed to a file gone meanwhile
                    if wal_is_full(self.path):
                        self._checkpoint()
                        if self.con is None:
                            return
                private_wal(self.path)
        finally:
            self._in_tx = False
            self._last_used = time.monotonic()
            self._mutex.release()

    def is_permanent(self, exc: BaseException) -> bool:
        """Would this failure happen again with the same records (the tables refuse them)?

        Disk full, out of memory, I/O errors and a busy file are transient: retried.
        """
        return isinstance(exc, PERMANENT_ERRORS)

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

    def close(self) -> None:
        with self._mutex:
            self.closed = True
            try:
                self._release()
            finally:
                self.lock.close()
                if self.fence is not None:
                    self.fence.close()


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def open_duckdb(
    path: str, *, wait_timeout: float | None = None, read_only: bool | None = None
) -> DuckDBConnection:
    """The DuckDB backend for ``path`` (created with mode 0600 on first use).

    ``read_only=None`` opens read-only when the store's folder or file cannot be written
    (a read-only mount, a folder of someone else's): reads work, writes are refused
    with a clear error. ``True`` asks for it, ``False`` refuses a read-only folder.
    """
    problem = store_path_problem(path)  # before abspath drops a trailing separator
    if problem:
        raise StoreError(f"The kernelext store path is refused: {problem}")
    path = os.path.abspath(path)
    check_store_path(path)  # a folder, a FIFO: before anything is created beside it
    parent = os.path.dirname(path)
    writable = is_writable(path)
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
            private_dirs(parent)
        except OSError as exc:
            raise StoreError(
                f"Cannot create the folder for the kernelext store {path!r}: {exc}"
            ) from None
        check_store_owner(path)  # nobody else can plant links or change it
    elif not os.path.exists(path):
        raise StoreError(f"There is no kernelext store at {path!r} to open read-only.")
    if wait_timeout is None:
        wait_timeout = float(os.environ.get("KERNELEXT_STORE_WAIT", "30"))
    return DuckDBConnection(path, wait_timeout=wait_timeout, read_only=read_only)
