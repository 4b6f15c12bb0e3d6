"""The PostgreSQL backend: the same schema and statements as DuckDB, for teams.

One long-lived write connection, driven by the store's writer thread; reads go
through a small pool of autocommit connections, so they never see uncommitted
work and never block the writer. The store's SQL uses ``?`` placeholders; they
are translated to psycopg's ``%s`` outside string literals, quoted names and
comments, and DDL types that PostgreSQL spells differently (``BLOB``) are mapped,
so the migrations list stays one list (``postgres_sql``).

Several processes (on several hosts) may open the same database at once: the
first transaction of every connection, which is the store's migration job,
takes a transaction-scoped advisory lock, so migrations run one at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..errors import StoreError
from .backend import Backend
from .conninfo import url_without_password
from .postgres_arrow import to_arrow
from .postgres_sql import placeholders, translate
from .sql_guard import (
    Params,
    breach,
    check_query,
    normalize_params,
    query_error,
    query_timeout,
    refusal,
)
from .writer import Tx

__all__ = [
    "PostgresConnection",
    "advisory_key",
    "connection_lost",
    "mask_password",
    "open_postgres",
    "translate",
    "url_without_password",
]

MIGRATION_LOCK = "kernelext:migrations"
READ_POOL_SIZE = 4
# psycopg exceptions whose transaction can simply be run again.
TRANSIENT = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
# Queries from kx.sql run as this role when the login may take it and it can read the
# store (docs/security.md); set_config(..., true) is SET LOCAL ROLE, for the transaction.
READER_ROLE = "kernelext_reader"
_TAKE_READER_ROLE = (
    "SELECT set_config('role', r.rolname, true) FROM pg_roles r WHERE r.rolname = %s"
    " AND NOT r.rolsuper AND pg_has_role(current_user, r.oid, 'MEMBER')"
    " AND has_table_privilege(r.oid, 'runs', 'SELECT')"
)


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_lock`` from a readable name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def mask_password(url: str) -> str:
    """The URL with its password (in the authority or ``?password=``) shown as ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is not None:
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}"
        if parts.port:
            netloc += f":{parts.port}"
        parts = parts._replace(netloc=netloc)
    if "password=" in parts.query:
        parts = parts._replace(query=re.sub(r"(^|&)password=[^&]*", r"\1password=***", parts.query))
    return urllib.parse.urlunsplit(parts)


class _PgTx:
    def __init__(self, con: psycopg.Connection[Any]) -> None:
        self._con = con

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._con.execute(translate(sql), list(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            with self._con.cursor() as cur:
                cur.executemany(translate(sql), [list(r) for r in rows])

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._con.execute(translate(sql), list(params)).fetchone()
        return row

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._con.execute(translate(sql), list(params)).fetchall()
        return rows


class _ReadPool:
    """A few autocommit connections shared by the reading threads of one process."""

    def __init__(self, url: str, size: int) -> None:
        self._url = url
        self._idle: list[psycopg.Connection[Any]] = []
        self._all: list[psycopg.Connection[Any]] = []
        self._free = threading.Semaphore(size)
        self._lock = threading.Lock()
        self.closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._free:
            with self._lock:
                if self.closed:
                    raise StoreError("the kernelext store is closed; open it again")
                con = self._idle.pop() if self._idle else None
            if con is None or con.closed or con.broken:
                con = _connect(self._url, autocommit=True)
                with self._lock:
                    self._all.append(con)
            try:
                yield con
            finally:
                with self._lock:
                    if not con.closed and not con.broken and not self.closed:
                        self._idle.append(con)
                    else:
                        if con in self._all:
                            self._all.remove(con)
                        with contextlib.suppress(Exception):
                            con.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            conns, self._all, self._idle = self._all, [], []
        for con in conns:
            with contextlib.suppress(Exception):
                con.close()


def connection_lost(exc: BaseException) -> bool:
    """The server went away (restart, admin shutdown, network): a new connection may work."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P"))


def _connect(url: str, *, autocommit: bool) -> psycopg.Connection[Any]:
    try:
        con: psycopg.Connection[Any] = psycopg.connect(
            url,
            autocommit=autocommit,
            application_name="kernelext",
            options="-c TimeZone=UTC -c client_min_messages=warning",
        )
    except psycopg.OperationalError as exc:
        raise StoreError(
            f"Cannot connect to the kernelext store {mask_password(url)}: "
            f"{str(exc).strip()}. Check that the server runs and that KERNELEXT_STORE "
            "(or %config Kernelext.store) holds the right postgresql:// URL."
        ) from None
    return con


class PostgresConnection(Backend):
    """Adapter the writer thread drives; reads use a small connection pool."""

    dialect = "postgres"
    for_update = " FOR UPDATE"  # READ COMMITTED: a status change locks its row
    for_share = " FOR SHARE"  # an owner's write waits for a take-over of its run, and back
    # Payloads stay in the database (BYTEA, up to 1 GiB): every host can read them.
    inline_limit = (1 << 30) - 1

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = mask_password(url)
        self.con = _connect(url, autocommit=False)
        self._pool = _ReadPool(url, READ_POOL_SIZE)
        self._first = True
        self._locks: dict[str, psycopg.Connection[Any]] = {}
        self._locks_lock = threading.Lock()

    # -- the writer's side -----------------------------------------------------------------
    def begin(self) -> _PgTx:
        if self.con.closed or self.con.broken:  # the server restarted: reconnect once
            self.con = _connect(self.url, autocommit=False)
        tx = _PgTx(self.con)
        if self._first:  # the migration job: one process at a time
            tx.execute("SELECT pg_advisory_xact_lock(?)", (advisory_key(MIGRATION_LOCK),))
        return tx

    def xact_lock(self, tx: Tx, name: str) -> None:
        """Hold the advisory lock ``name`` until the transaction ends."""
        tx.execute("SELECT pg_advisory_xact_lock(?)", (advisory_key(name),))

    def commit(self) -> None:
        try:
            self.con.commit()
        except psycopg.OperationalError as exc:
            if connection_lost(exc):  # not retried: the commit may have landed
                raise StoreError(
                    f"The connection to the kernelext store {self.path} broke during COMMIT, so "
                    "whether the last write landed is unknown. Check the run with "
                    "`kernelext show RUN_ID`; kernelext reconnects on the next write."
                ) from exc
            raise
        self._first = False

    def rollback(self) -> None:
        self.con.rollback()

    def is_transient(self, exc: BaseException) -> bool:
        """The job's transaction was rolled back and running it again is safe.

        A deadlock victim, a serialization failure, or a connection that was lost
        before COMMIT (the next ``begin`` reconnects).
        """
        return isinstance(exc, TRANSIENT) or connection_lost(exc)

    # -- reads -------------------------------------------------------------------------------
    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows, _names = self.read_with_names(sql, params)
        return rows

    def read_with_names(
        self, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        query = translate(sql)
        for attempt in (1, 2):
            try:
                with self._pool.connection() as con:
                    cur = con.execute(query, list(params))
                    names = [d.name for d in (cur.description or [])]
                    return cur.fetchall(), names
            except psycopg.OperationalError as exc:
                if attempt == 2 or not connection_lost(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def read_arrow(
        self,
        sql: str,
        params: Params = None,
        *,
        allow_files: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Run one query nobody reviewed (``kx.sql``) and return a pyarrow Table.

        ``sql_guard`` checks it with DuckDB's parser first (a query it cannot parse is
        refused: it could not be checked). What passes runs in a READ ONLY transaction that
        is always rolled back, as the role ``kernelext_reader`` when this login may take it
        and it can read the store (``READER_ROLE``), over the extended protocol (one
        statement, parameters bound by the server); session advisory locks are released
        afterwards. File readers are DuckDB's: a PostgreSQL store refuses them, allowed or
        not, and its server-side file functions (pg_read_file, ...) are refused always.
        What runs is ``checked.sql``, the text that was checked (an EXPLAIN is rebuilt from
        its checked statement), never the text as given.
        """
        checked = check_query(sql.strip(), allow_files=True, postgres=True)
        if checked.reads_files:  # DuckDB's file readers: whatever allow_files says
            raise refusal("reading files on a PostgreSQL store", "files_server")
        text, bound = placeholders(checked.sql, normalize_params(params))
        for attempt in (1, 2):
            try:
                columns, rows = self._read_only(text, bound, timeout)
                break
            except psycopg.OperationalError as exc:
                if attempt == 2 or not connection_lost(exc):
                    raise
        return to_arrow(columns, rows)

    def _read_only(
        self, query: str, params: list[Any] | dict[str, Any], timeout: float | None = None
    ) -> tuple[list[Any], list[tuple[Any, ...]]]:
        columns: list[Any] = []
        rows: list[tuple[Any, ...]] = []
        with self._pool.connection() as con:
            try:
                with con.transaction():
                    con.execute("SET TRANSACTION READ ONLY")
                    # Strings are read as DuckDB's parser read them when it checked the query.
                    con.execute("SET LOCAL standard_conforming_strings = on")
                    con.execute(_TAKE_READER_ROLE, [READER_ROLE])
                    if timeout is not None:
                        milliseconds = max(1, int(timeout * 1000))
                        con.execute(f"SET LOCAL statement_timeout = {milliseconds}")
                    # prepare=True: the extended protocol, one statement at most, always
                    # (without parameters psycopg would use the simple protocol).
                    cur = con.execute(query, params, prepare=True)
                    columns = list(cur.description or [])
                    rows = cur.fetchall() if columns else []
                    _no_transaction_id(con, query)
                    raise _Rollback
            except _Rollback:
                pass
            except pg_errors.QueryCanceled:
                if timeout is None:
                    raise
                raise query_timeout(timeout) from None
            except pg_errors.ReadOnlySqlTransaction as exc:
                raise refusal(f"a write ({exc.diag.message_primary})", "write") from None
            except pg_errors.InsufficientPrivilege as exc:
                reason = exc.diag.message_primary
                raise refusal(f"what the read-only role may not do ({reason})", "server") from None
            except pg_errors.SyntaxError as exc:
                if "multiple commands" in str(exc):
                    raise refusal("more than one statement", "multiple") from None
                raise query_error(exc) from exc
            except (pg_errors.ProgrammingError, pg_errors.DataError) as exc:
                raise query_error(exc) from exc
            finally:
                if not con.closed and not con.broken:
                    with contextlib.suppress(psycopg.Error):
                        con.execute("SELECT pg_advisory_unlock_all()")
        return columns, rows

    # -- cross-process coordination ------------------------------------------------------
    @contextlib.contextmanager
    def try_advisory_lock(self, name: str) -> Iterator[bool]:
        """Hold a session advisory lock while the block runs; yields False if taken.

        Exactly one holder per name across every process and host using the database
        (the sweeper uses this). The lock lives on its own connection, so it is released
        when the block ends, or by the server when this process dies.
        """
        key = advisory_key(name)
        con = _connect(self.url, autocommit=True)
        try:
            row = con.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()
            yield bool(row and row[0])
        finally:
            con.close()  # closing the session releases the lock

    def close(self) -> None:
        self._pool.close()
        with contextlib.suppress(Exception):
            if not self.con.closed:
                self.con.rollback()
        self.con.close()


def _no_transaction_id(con: Any, query: str) -> None:
    """The third layer: a READ ONLY transaction that was given a transaction id wrote.

    PostgreSQL assigns an id at a transaction's first write (or lock that needs one), so
    after the query it must still have none; otherwise :class:`SurfaceBreach`, loudly
    (the transaction is rolled back all the same).
    """
    row = con.execute("SELECT txid_current_if_assigned()").fetchone()
    if row is not None and row[0] is not None:
        raise breach(f"was given transaction id {row[0]} (it wrote something)", query)


class _Rollback(Exception):
    """Leaves the read-only transaction block by rolling it back."""


def open_postgres(url: str) -> PostgresConnection:
    """Connect to the database at ``url`` (``postgresql://user:pw@host:port/db``)."""
    return PostgresConnection(url)
