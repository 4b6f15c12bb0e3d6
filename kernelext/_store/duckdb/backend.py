"""The embedded DuckDB backend: one file, one long-lived write connection."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from ..._validate import store_path_problem
from ...errors import StoreError, StoreLockedError, StoreWriteError
from ..base import Backend
from ..records import FENCED
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
from ..writer import Tx, Writer
from .bulk import apply_records
from .fence import FenceFiles, foreign_records
from .handoff import HandoffLock
from .hot_path import JournalHotPath
from .mailbox import ForeignStops, Posted, post_when_busy
from .recovery import fold_orphaned_journals
from .side_files import SideFiles
from .store_files import (
    check_store_owner,
    check_store_path,
    open_store_file,
    own_folder,
    private_dirs,
)

__all__ = ["DuckDBConnection", "duckdb_config", "open_duckdb"]

_log = logging.getLogger("kernelext")
INLINE_LIMIT = 64 << 10  # payloads above 64 KiB go to a side file, off the commit path
_PID = re.compile(r"\(PID (\d+)\)")
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
    duckdb.NotImplementedException,  # e.g. a batch's VALUES mixing a text into a number column
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


def duckdb_config() -> dict[str, str | bool | int | float | list[str]]:
    """``kx.duckdb_config()``: the configuration another DuckDB connection to the store file
    in this process must pass (DuckDB refuses a second configuration of an open file), e.g.
    ``duckdb.connect(kx.open_store().location, config=kx.duckdb_config())`` for JupySQL.
    A new dict each call: changing it changes nothing in kernelext."""
    return dict(DUCKDB_CONFIG)


# The throw-away database of a query that may read files (allow_files): no extension is
# installed or loaded for it (the built-in CSV, Parquet, JSON and text readers suffice).
_FILES_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "false",
    "allow_community_extensions": "false",
}


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
                    self._header_fd = _open_header(self.path)
                    self._check_file()  # replaced or rewritten while we waited our turn
                self._opening = True  # a DuckDB connection of another program may hold it
                try:
                    self.con = _connect(self.path, self.wait_timeout, read_only=self.read_only)
                finally:
                    self._opening = False
                if self._identity is None:
                    self._identity = _identity(self.path)
                if self._header_fd is None and not self.read_only:  # DuckDB just made it
                    self._header_fd = _open_header(self.path)
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
        return tuple(_file_signal(p) for p in (self.path, self.path + ".wal"))

    # -- the store file replaced or deleted under this process ----------------------------
    def _lost(self) -> str | None:
        return self.lost

    def _check_file(self) -> None:
        """Refuse to go on when the path no longer names the file this process opened.

        DuckDB keeps writing to the file it opened: after an ``os.replace`` over it (a
        restore, a sync tool) or its deletion, every commit would go to a file nobody can
        open again, and the run would report ``completed``. One ``stat`` per transaction
        (a group commit or a fold batch, which cost a millisecond) and per reconnect (a
        hand-over) finds it; from then on nothing is written here, and the journal keeps
        what was not folded yet (it is not deleted while records wait in it).
        """
        self._check_file_at(committed=False)

    def _check_file_at(self, *, committed: bool) -> None:
        """``_check_file``; ``committed``: just after this process's own COMMIT, whose
        checkpoint may have shrunk the file (the size it leaves is the new floor).

        Same inode but truncated or rewritten in place (``os.truncate``, ``> file``, a
        tool writing over it) is found too, cheaply: the size must not shrink below what
        this process saw after its own last commit while it held the file, and bytes 8-12
        must still be DuckDB's magic ``DUCK``. It cannot see a rewrite that keeps both (a
        valid DuckDB file of at least that size copied over it in place, or writes inside
        the file past its header): that would need a checksum of the whole file.
        """
        if self.lost is None and self._identity is not None and not self.read_only:
            st = _stat(self.path)
            now = None if st is None else (st.st_dev, st.st_ino)
            what = None
            if now != self._identity:
                what = "deleted" if now is None else "replaced by another file"
            else:
                assert st is not None
                magic = _magic(self._header_fd)  # None while not connected: not read then
                if magic == DUCKDB_MAGIC:
                    self._header_seen = True
                # Just after a commit the size may have shrunk (its checkpoint), never below
                # DuckDB's headers: shorter than them, the file was cut while it committed.
                floor = DUCKDB_HEADERS if committed and self._size_seen else self._size_seen
                if st.st_size < floor:
                    what = (
                        f"truncated ({st.st_size} bytes now, {self._size_seen} after this "
                        "process's last commit)"
                    )
                elif self._header_seen and magic is not None and magic != DUCKDB_MAGIC:
                    what = "overwritten in place (its header no longer reads DUCK)"
                elif committed and self.con is not None:
                    self._size_seen = st.st_size
            if what is None:
                return
            journal = self.hot_path.path if self.hot_path is not None else self.path + ".journal.*"
            kept = (
                f"the records not yet in its tables are kept in the journal {journal}, nothing "
                "acknowledged is lost"
                if os.path.exists(journal) or self.hot_path is None
                else f"its folder was removed too, with the journal {journal}"
            )
            self.lost = (
                f"The kernelext store file {self.path!r} was {what} while this process was using "
                "it (os.replace, a restore from a backup, a sync tool, rm?). kernelext writes "
                f"nothing more to it: {kept}. Put the original file back (or keep the new "
                "one), open it again with kx.open_store(path) (or restart the kernel), then "
                "call kx.resume(run_id) for the runs that were executing."
            )
            _log.error("kernelext: %s", self.lost)
        if self.lost is not None:
            raise StoreWriteError(self.lost)

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

    def _release(self, *, handing_over: bool = False) -> None:
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
                if statement == "COMMIT":
                    self._check_file_at(committed=True)  # committed to a file gone meanwhile
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
        (``_lock_down``). Only a query that the check itself found reading files (with
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

    def close(self) -> None:
        with self._mutex:
            self.closed = True
            try:
                self._release()
            finally:
                self.lock.close()
                if self.fence is not None:
                    self.fence.close()


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


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``, or None when there is none."""
    st = _stat(path)
    return None if st is None else (st.st_dev, st.st_ino)


def _file_signal(path: str) -> tuple[int, int, int] | None:
    st = _stat(path)
    if st is None or st.st_size == 0:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


DUCKDB_MAGIC = b"DUCK"  # bytes 8-12 of every DuckDB database file
DUCKDB_HEADERS = 3 * 4096  # its main header and two database headers: no file is shorter


def _open_header(path: str) -> int | None:
    """A read descriptor of the store file, held while connected (see ``_header_fd``)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never waits on a FIFO
    except OSError:
        return None


def _magic(fd: int | None) -> bytes | None:
    """Bytes 8-12 of the file (DuckDB's magic) read through ``fd`` (never by opening the
    file: see ``_header_fd``), or None without a descriptor or when it cannot be read."""
    if fd is None:
        return None
    try:
        return os.pread(fd, 4, 8)
    except OSError:
        return None


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _connect(path: str, timeout: float, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Connect (creating the file with mode 0600); wait out a foreign holder up to ``timeout``.

    A file written by a newer kernelext, or someone else's DuckDB file, is refused here,
    on every connect, before anything writes to it.
    """
    from ..compat import check_store

    if not read_only:  # DuckDB opens (and rewrites) the WAL by name: never a link
        with contextlib.suppress(FileNotFoundError):
            os.close(open_store_file(path + ".wal", os.O_RDONLY, make_private=True))
        if os.path.lexists(path + ".tmp"):  # DuckDB spills there: a folder of this user's
            own_folder(path + ".tmp")
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
        _lock_down(con)
        if read_only:
            return con
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, 0o600)  # the store file (through a link to it the user made)
        _private_wal(path)
        return con


def _lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Settle the instance for good, after the store's own settings (``threads``).

    External access off: no SQL on this instance reads or writes a file other than the
    store's own, installs or loads an extension, or attaches a database; kernelext's side
    files and journals are Python I/O. Then the configuration is locked: no statement can
    change a setting (``memory_limit``, ``enable_external_access``, ...) while it is open.
    Both hold for every cursor; neither can be undone until the instance closes.
    """
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _whole_table(cur: duckdb.DuckDBPyConnection, name: str) -> Any:
    quoted = '"' + name.replace('"', '""') + '"'
    return cur.sql(f"SELECT * FROM main.{quoted}").to_arrow_table()


def _private_wal(path: str) -> None:
    """Make sure the WAL exists with mode 0600 before DuckDB writes records into it.

    DuckDB deletes the WAL at every checkpoint and creates it again on the next write
    with the process umask (often 0644): the records would be readable by every user.
    An empty WAL that DuckDB finds is used as it is (and removed on open).
    """
    with contextlib.suppress(FileExistsError):
        os.close(open_store_file(path + ".wal", os.O_WRONLY | os.O_CREAT | os.O_EXCL))


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


def coordination_files(path: str) -> list[str]:
    """The lock files beside the store at ``path`` that an open creates."""
    path = os.path.abspath(path)
    return [path + ".lock", path + ".want"]


def remove_created_coordination_files(before: list[str]) -> None:
    """After a failed open: remove the coordination files in ``before`` (files that did
    not exist before it) that nobody holds now, so a failed open leaves no litter."""
    from .platform import try_lock_file, unlock_file

    for name in before:
        try:
            fd = open_store_file(name, os.O_RDWR)
        except (OSError, StoreError):
            continue
        try:
            if try_lock_file(fd):  # nobody waits on it or holds it
                try:
                    os.unlink(name)
                finally:
                    unlock_file(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


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
