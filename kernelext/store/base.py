"""Plumbing shared by every backend: the writer, reads, migrations and events."""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from ..errors import StoreWriteError
from .fold import Folder
from .journal import Journal
from .records import apply_record, check_record
from .recovery import fold_orphaned_journals
from .schema import MIGRATIONS, SCHEMA_VERSION_DDL
from .writer import Tx, Writer

__all__ = ["Backend", "StoreBase", "actor", "utcnow"]

T = TypeVar("T")
_log = logging.getLogger("kernelext")
TRANSIENT_RETRIES = 5  # a deadlock victim (PostgreSQL) runs again, at most this often


def utcnow() -> dt.datetime:
    """Now, as a naive datetime in UTC (the store keeps every timestamp in UTC)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def actor() -> str:
    """Who is asking: the OS user, host and process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


class Backend(Protocol):
    """A connection adapter: what a backend module gives the store."""

    dialect: str
    path: str

    def begin(self) -> Tx: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def read_arrow(self, sql: str) -> Any: ...


class StoreBase:
    """Owns the writer thread; subclasses (mixins) add the record operations."""

    def __init__(self, backend: Backend, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self.backend = backend
        self.clock = clock
        self.location = backend.path
        self.for_update = " FOR UPDATE" if backend.dialect == "postgres" else ""
        self.journal: Journal | None = None
        self.folder: Folder | None = None
        self._journaled_intents: dict[Any, dict[str, Any]] = {}
        self._last_queued: Future[Any] | None = None
        if backend.dialect == "duckdb":
            backend.after_connect = self._fold_orphaned_journals  # type: ignore[attr-defined]
        self._writer = Writer(backend, name=f"kernelext-writer[{os.path.basename(backend.path)}]")
        self.closed = False
        self.read_only = bool(getattr(backend, "read_only", False))
        try:
            if self.read_only:  # nothing is written, not even a migration
                self._writer.run(lambda tx: None)
            else:
                self._writer.run(self._migrate)
            if backend.dialect == "duckdb" and not self.read_only:
                self.journal = Journal(backend.path)
                self._writer.rollback_listeners.append(self.journal.rolled_back)
                self.folder = Folder(
                    self.journal, self._writer, is_permanent=self._is_permanent, now=self.now
                )
        except BaseException:
            self._writer.close()
            raise

    # -- plumbing ------------------------------------------------------------
    def serialize_tx(self, tx: Tx, name: str) -> None:
        """Let one transaction at a time past this point for ``name``, until it ends.

        PostgreSQL: a transaction-scoped advisory lock, so check-then-insert logic is
        safe across processes under READ COMMITTED. DuckDB: nothing to do, one writer
        (one process at a time, one thread in it) already runs the transactions in turn.
        """
        lock = getattr(self.backend, "xact_lock", None)
        if lock is not None:
            lock(tx, name)

    def now(self) -> dt.datetime:
        return self.clock()

    def write(self, job: Callable[[Tx], T]) -> T:
        """Run ``job`` in a transaction and return once it has committed.

        A server backend aborts a transaction that deadlocked with another process
        (``backend.is_transient``); it was rolled back, so it simply runs again.
        """
        self._refuse_if_read_only()
        self._fold_first()
        transient = getattr(self.backend, "is_transient", None)
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                return self._writer.run(job)
            except Exception as exc:
                if transient is None or attempt == TRANSIENT_RETRIES or not transient(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise StoreWriteError(
                f"The kernelext store {self.location!r} is open read-only (its folder or file "
                "cannot be written): you can query it, but runs cannot start, stop or resume "
                "here. Open it from a writable location to change it."
            )

    @contextlib.contextmanager
    def try_advisory_lock(self, name: str) -> Iterator[bool]:
        """``with store.try_advisory_lock("sweep") as mine:`` — is this process the one?

        On PostgreSQL a session advisory lock: exactly one holder per name across all
        processes and hosts. An embedded backend has nobody to coordinate with here,
        so the block always gets it.
        """
        lock = getattr(self.backend, "try_advisory_lock", None)
        if lock is None:
            yield True
            return
        with lock(name) as got:
            yield bool(got)

    def write_async(self, job: Callable[[Tx], T]) -> Future[T]:
        """Queue ``job``; it commits with the next group. Wait on the future to know."""
        self._refuse_if_read_only()
        queued = self._writer.submit_detached(job)
        self._last_queued = queued  # jobs run in order: a read waits for the last one
        return queued

    # -- hot-path records (journaled on DuckDB) ----------------------------------
    def record(self, kind: str, data: dict[str, Any], *, sync: bool) -> None:
        """Store one hot-path record; with ``sync``, return once it is durable.

        Raises :class:`StoreWriteError` when it cannot be stored (disk full, ...): then
        nothing was acknowledged for it.
        """
        check_record(kind, data)
        self._refuse_if_read_only()
        journal = self.journal
        if journal is None:

            def job(tx: Tx) -> None:
                apply_record(tx, kind, data)

            if sync:
                self.write(job)
            else:
                self.write_async(job)
            return
        assert self.folder is not None
        journal.append(kind, data, sync=sync, enqueue=self.folder.schedule)

    @property
    def quarantined_runs(self) -> set[str]:
        """Runs one of whose records the tables refused (they wait in needs_decision)."""
        return self.folder.quarantined_runs if self.folder is not None else set()

    def _fold_orphaned_journals(self, run_tx: Callable[[Callable[[Tx], Any]], Any]) -> None:
        """Fold what killed processes journaled but never folded (on every connect)."""
        own = self.journal.path if self.journal is not None else None
        fold_orphaned_journals(
            run_tx,
            self.backend.path,
            own,
            now=self.now,
            is_permanent=self._is_permanent,
        )

    def _is_permanent(self, exc: BaseException) -> bool:
        check = getattr(self.backend, "is_permanent", None)
        return bool(check(exc)) if check is not None else False

    def _catch_up(self) -> None:
        """A read sees what this process wrote: journaled records and queued jobs.

        While the store refuses writes (disk full, ...), the read tries the fold once and
        then sees the tables as they are; the records wait safely in the journal (and any
        write, a resume's take-over included, refuses until they are folded).
        """
        if self._writer.in_writer_thread():
            return
        journal = self.journal
        if journal is not None and journal.unfolded:
            with contextlib.suppress(Exception):
                self.flush()
            return
        queued = self._last_queued
        if queued is not None and not queued.done():
            with contextlib.suppress(Exception):  # its failure is logged by the writer
                queued.result()

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._catch_up()
        return self.backend.read(sql, params)

    def read_arrow(self, sql: str) -> Any:
        """A read-only query as a pyarrow Table (what ``kx.sql`` uses)."""
        self._catch_up()
        return self.backend.read_arrow(sql)

    def read_dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        rows, names = self._read_with_names(sql, params)
        return [dict(zip(names, row, strict=False)) for row in rows]

    def _read_with_names(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        self._catch_up()
        reader = getattr(self.backend, "read_with_names", None)
        if reader is None:  # pragma: no cover - every shipped backend has it
            raise NotImplementedError
        result: tuple[list[tuple[Any, ...]], list[str]] = reader(sql, params)
        return result

    def _fold_first(self) -> None:
        """After a write fault, the journal folds before any other write (its order)."""
        folder, journal = self.folder, self.journal
        if folder is not None and journal is not None and folder.fault and journal.unfolded:
            self.flush()

    def flush(self) -> None:
        """Wait until everything queued or journaled so far is in the tables.

        Raises the store's error when the journal cannot be folded now (disk full, ...);
        the records stay in the journal and are folded once the store takes writes.
        """
        folder, journal = self.folder, self.journal
        if folder is None or journal is None or not journal.unfolded:
            self._writer.run(lambda tx: None)
            return
        stalled = 0
        while True:  # a fold that met a refused record goes on one record at a time
            before = journal.folded_seq
            folder.kick()
            self._writer.run(lambda tx: None)
            stalled = stalled + 1 if journal.folded_seq == before else 0
            if not journal.unfolded or folder.fault is not None or stalled >= 3:
                break
        if folder.fault is not None and journal.unfolded:
            raise StoreWriteError(
                f"kernelext cannot write to the store {self.location!r} now "
                f"({folder.fault}); {journal.pending_count} record(s) wait safely in "
                f"{journal.path} and are folded once it takes writes again."
            ) from None

    @property
    def commits(self) -> int:
        return self._writer.commits

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.folder is not None and self.journal is not None and self.journal.unfolded:
                self.folder.kick()
            if self.folder is not None:
                self.folder.close()
            self._writer.close()
            if self.journal is not None and self.journal.close():
                _log.warning(
                    "kernelext: the store closed with records not yet in its tables; they are "
                    "kept in %s and folded when the store is next opened",
                    self.journal.path,
                )

    def __enter__(self) -> StoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ----------------------------------------------------------------
    def _migrate(self, tx: Tx) -> int:
        from .compat import check_store  # refuses a newer or foreign store before any write

        check_store(tx.fetchall, self.location, self.backend.dialect)
        tx.execute(SCHEMA_VERSION_DDL)
        row = tx.fetchone("SELECT max(version) FROM schema_version")
        current = int(row[0]) if row and row[0] is not None else 0
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                tx.execute(statement)
            tx.execute(
                "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.description, self.now()),
            )
            current = migration.version
        return current

    def schema_version(self) -> int:
        row = self.read("SELECT max(version) FROM schema_version")
        return int(row[0][0]) if row and row[0][0] is not None else 0

    # -- events ------------------------------------------------------------------
    def event(
        self,
        tx: Tx,
        run_id: str | None,
        kind: str,
        *,
        from_status: str | None = None,
        to_status: str | None = None,
        source: str | None = None,
        who: str | None = None,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Append one audit row inside the caller's transaction."""
        tx.execute(
            "INSERT INTO events (run_id, occurred_at, kind, from_status, to_status, source,"
            " actor, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                self.now(),
                kind,
                from_status,
                to_status,
                source,
                who or actor(),
                reason,
                json.dumps(detail, default=str, sort_keys=True) if detail else None,
            ),
        )

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.read_dicts("SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))
