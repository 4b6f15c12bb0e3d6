"""Plumbing shared by every backend: the writer, reads, migrations and events."""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from .._expiry_policy import POLICY, ExpiryPolicy
from .._validate import register
from ..errors import OwnershipLost, StoreWriteError
from .backend import Backend, HotPath
from .observe import OBSERVERS, notify
from .record_door import scrub_record
from .records import FENCED, WHAT, apply_record, check_record
from .schema import MIGRATIONS, SCHEMA_VERSION_DDL
from .writer import Tx, Writer

__all__ = ["Backend", "HotPath", "StoreBase", "actor", "in_list", "process_start", "utcnow"]

T = TypeVar("T")
_log = logging.getLogger("kernelext")
TRANSIENT_RETRIES = 5  # a deadlock victim (PostgreSQL) runs again, at most this often


def utcnow() -> dt.datetime:
    """Now, as a naive datetime in UTC (the store keeps every timestamp in UTC)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc/<pid>/stat``
    field 22); None where that cannot be read (another OS, no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # Field 2 (the command) is in parentheses and may hold spaces or ')': split after it.
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return int(rest[19])  # field 22 = the 20th after the command
    except (IndexError, ValueError):
        return None


_START: dict[int, int | None] = {}


def actor() -> str:
    """Who is asking: the OS user, host and process, ``user@host:pid.start`` where
    ``start`` is the process start time (clock ticks since boot; left out where it cannot
    be read), so that a reused PID is never taken for the owner (``core/lease.py``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "nobody"
    pid = os.getpid()
    if pid not in _START:  # one read per process (and per fork)
        _START[pid] = process_start(pid)
    start = _START[pid]
    tail = f".{start}" if start is not None else ""
    return f"{user}@{socket.gethostname()}:{pid}{tail}"


def in_list(values: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """``("(?, ?)", (a, b))``: an SQL ``IN`` list of placeholders and the values to bind,
    for a group of statuses (``status IN {marks}``); statuses are never quoted in SQL."""
    bound = tuple(sorted(values))
    return "(" + ", ".join("?" for _ in bound) + ")", bound


def equal_filters(*pairs: tuple[str, Any]) -> tuple[str, list[Any]]:
    """``(" WHERE a = ? AND b = ?", [x, y])`` for the pairs whose value is not None."""
    used = [(name, value) for name, value in pairs if value is not None]
    if not used:
        return "", []
    return " WHERE " + " AND ".join(f"{name} = ?" for name, _ in used), [v for _, v in used]


class StoreBase:
    """Owns the writer thread; subclasses (mixins) add the record operations."""

    def __init__(self, backend: Backend, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self.backend = backend
        self.clock = clock
        self.location = backend.path
        self.for_update = backend.for_update
        self.read_only = backend.read_only
        self.expiry: ExpiryPolicy = POLICY  # deadlines of waiting runs (see transitions)
        self.hot_path: HotPath | None = None
        self._journaled_intents: dict[Any, dict[str, Any]] = {}
        # Ownership epochs this process holds (run id -> epoch), set by a take-over or a
        # start; every record it writes for the run carries it (``records.FENCED``).
        self._held_epochs: dict[str, int] = {}
        self._intent_runs: dict[Any, str] = {}  # effect key -> run id (its outcome's fence)
        # False in a worker of run.map(executor=...): its item completions leave the run's
        # count of completed steps to the owner (records.UPDATES_RUN).
        self.counts_items = True
        # Runs this process ended through the journal: run id -> (record seq, status).
        self._journaled_ends: dict[str, tuple[int, str]] = {}
        self._last_queued: Future[Any] | None = None
        backend.bind(self.now)
        self._writer = Writer(backend, name=f"kernelext-writer[{os.path.basename(backend.path)}]")
        self.closed = False
        # The table of questions (``run.ask``): ``inputs`` in a store of schema 5 to 7 read
        # read-only (no migration runs there), else ``questions``.
        self.questions_table = "questions"
        try:
            if self.read_only:  # nothing is written, not even a migration
                self._writer.run(lambda tx: None)
                if self.schema_version() < 8:  # before migration 8 named the table questions
                    self.questions_table = "inputs"
            else:
                self._writer.run(self._migrate)
                self.hot_path = backend.open_hot_path(self._writer)
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
        self.backend.xact_lock(tx, name)

    def now(self) -> dt.datetime:
        return self.clock()

    def write(self, job: Callable[[Tx], T]) -> T:
        """Run ``job`` in a transaction and return once it has committed.

        A server backend aborts a transaction that deadlocked with another process
        (``backend.is_transient``); it was rolled back, so it simply runs again.
        """
        self._refuse_if_read_only()
        self._fold_first()
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                return self._writer.run(job)
            except Exception as exc:
                if attempt == TRANSIENT_RETRIES or not self.backend.is_transient(exc):
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
        with self.backend.try_advisory_lock(name) as got:
            yield bool(got)

    def write_async(self, job: Callable[[Tx], T]) -> Future[T]:
        """Queue ``job``; it commits with the next group. Wait on the future to know."""
        self._refuse_if_read_only()
        if self.hot_path is not None and self.hot_path.unfolded:
            self.hot_path.queue_fold()  # what was journaled before it is applied before it
        queued = self._writer.submit_detached(job)
        self._last_queued = queued  # jobs run in order: a read waits for the last one
        return queued

    # -- hot-path records (journaled on DuckDB) ----------------------------------
    def record(self, kind: str, data: dict[str, Any], *, sync: bool) -> int | None:
        """Store one hot-path record; with ``sync``, return once it is durable. Returns its
        sequence number in this process's journal (None: applied directly, no journal).

        Raises :class:`StoreWriteError` when it cannot be stored (disk full, ...): then
        nothing was acknowledged for it.
        """
        data, epoch = self.prepare_record(kind, data)
        if OBSERVERS:
            notify(kind, data)
        if self.hot_path is not None:
            fence = self.backend.fence
            if epoch is not None and fence is not None and kind != "outcome":
                return self._fenced_record(kind, data, epoch, sync=sync)
            # an outcome: the call was made; a stale one is refused by the fold
            return self.hot_path.record(kind, data, sync=sync)
        lock, update_lock = self.backend.for_share, self.backend.for_update

        def job(tx: Tx) -> None:
            apply_record(tx, kind, data, lock=lock, update_lock=update_lock)

        if sync:
            self.write(job)
        else:
            self.write_async(job)
        return None

    def prepare_record(self, kind: str, data: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """A record checked, scrubbed (the door for journal frames and direct writes alike)
        and stamped with the held epoch; returns it and that epoch (None: not fenced)."""
        check_record(kind, data)
        self._refuse_if_read_only()
        data = scrub_record(kind, data)
        return data, self._stamp(kind, data)

    # -- ownership epochs (one owner per run) ---------------------------------------
    def hold_epoch(self, run_id: str, epoch: int) -> None:
        """This process owns ``run_id`` at ``epoch`` (after a take-over or a start)."""
        self._held_epochs[run_id] = int(epoch)

    def held_epoch(self, run_id: str) -> int | None:
        return self._held_epochs.get(run_id)

    def _stamp(self, kind: str, data: dict[str, Any]) -> int | None:
        """Put the held epoch on an owner's record; returns it (None: not fenced)."""
        if kind not in FENCED:
            return None
        run_id = data.get("run_id")
        if kind == "outcome" and run_id is None:
            run_id = self._intent_runs.get(data.get("key"))
            if run_id is not None:
                data["run_id"] = run_id
        if "epoch" not in data and isinstance(run_id, str):
            held = self._held_epochs.get(run_id)
            if held is not None:
                data["epoch"] = held
        epoch = data.get("epoch")
        return int(epoch) if epoch is not None else None

    def _fenced_record(self, kind: str, data: dict[str, Any], epoch: int, *, sync: bool) -> int:
        """Append ``kind`` under the run's fence, shared: refused (``OwnershipLost``) unless
        the fence still holds ``epoch``; a take-over waits for the append (``fence.py``)."""
        fence, run_id = self.backend.fence, data["run_id"]
        assert self.hot_path is not None
        for _ in range(2):
            with fence.shared(run_id) as current:
                if current == epoch:
                    return self.hot_path.record(kind, data, sync=sync)
            if current is not None:
                break
            # No fence file (a run from before fences): the tables say, once, outside the
            # lock (a read may wait for the store file), then the fence starts from there.
            rows = self.backend.read("SELECT owner_epoch FROM runs WHERE id = ?", (run_id,))
            if not rows or rows[0][0] != epoch:
                break
            fence.start(run_id, epoch)
        raise self.ownership_lost(run_id, epoch, kind)

    def ownership_lost(self, run_id: str, held: int | None, what: str = "write") -> OwnershipLost:
        """The error for a refused write: who owns the run now, since when, its epoch."""
        owner = since = epoch = None
        with contextlib.suppress(Exception):  # the message must not fail on a store fault
            rows = self.backend.read(
                "SELECT r.owner, r.owner_epoch, (SELECT max(occurred_at) FROM events e"
                " WHERE e.run_id = r.id AND e.kind IN ('resumed', 'created')) FROM runs r"
                " WHERE r.id = ?",
                (run_id,),
            )
            if rows:
                owner, epoch, since = rows[0]
        return OwnershipLost(
            run_id, owner=owner, since=since, epoch=epoch, held=held, what=WHAT.get(what, what)
        )

    @property
    def quarantined_runs(self) -> set[str]:
        """Runs one of whose records the tables refused (they wait in needs_decision)."""
        return self.hot_path.quarantined_runs if self.hot_path is not None else set()

    def _catch_up(self) -> None:
        """A read sees what this process wrote: journaled records and queued jobs.

        While the store refuses writes (disk full, ...), the read tries the fold once and
        then sees the tables as they are; the records wait safely in the journal (and any
        write, a resume's take-over included, refuses until they are folded).
        """
        if self._writer.in_writer_thread():
            return
        if self.hot_path is not None and self.hot_path.unfolded:
            self.hot_path.catch_up()
            return
        queued = self._last_queued
        if queued is not None and not queued.done():
            with contextlib.suppress(Exception):  # its failure is logged by the writer
                queued.result()

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._catch_up()
        return self.backend.read(sql, params)

    def read_arrow(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        allow_files: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """A read-only query as a pyarrow Table (what ``kx.sql`` uses): ``params`` bound to
        ``?``/``$1`` (a sequence) or ``$name`` (a mapping); files outside the store only
        with ``allow_files``. A query that could change anything raises ReadOnlyError; one
        still running after ``timeout`` seconds is interrupted (``QueryTimeout``)."""
        self._catch_up()
        if timeout is None:
            return self.backend.read_arrow(sql, params, allow_files=allow_files)
        return self.backend.read_arrow(sql, params, allow_files=allow_files, timeout=timeout)

    def read_dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        rows, names = self._read_with_names(sql, params)
        return [dict(zip(names, row, strict=False)) for row in rows]

    def _read_with_names(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        self._catch_up()
        return self.backend.read_with_names(sql, params)

    def _fold_first(self) -> None:
        """After a write fault, journaled records fold before any other write (order)."""
        if self.hot_path is not None:
            self.hot_path.fold_first()

    def flush(self) -> None:
        """Wait until everything queued or journaled so far is in the tables.

        Raises :class:`StoreWriteError` when the journal cannot be folded now (disk full,
        ...); the records stay in the journal and are folded once the store takes writes.
        """
        if self.hot_path is not None:
            self.hot_path.flush()
        else:
            self._writer.run(lambda tx: None)

    @property
    def commits(self) -> int:
        return self._writer.commits

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.hot_path is not None:
                self.hot_path.close_writes()
            self._writer.close()
            if self.hot_path is not None:
                self.hot_path.close()

    def __enter__(self) -> StoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ----------------------------------------------------------------
    def _migrate(self, tx: Tx) -> int:
        from .compat import check_store  # refuses a newer or foreign store before any write

        check_store(tx.fetchall, self.location, self.backend.foreign_if_any_table)
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
        at: dt.datetime | None = None,
    ) -> None:
        """Append one audit row inside the caller's transaction (``reason`` and ``detail``
        are scrubbed of secrets by the write path, see ``store/columns.py``); ``at``: when
        it happened (default: now)."""
        if OBSERVERS:
            notify(
                "event",
                {"run_id": run_id, "kind": kind, "source": source, "who": who, "reason": reason},
            )
        tx.execute(
            "INSERT INTO events (run_id, occurred_at, kind, from_status, to_status, source,"
            " actor, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                at or self.now(),
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
        return self.read_dicts(
            "SELECT * FROM events WHERE run_id = ? ORDER BY occurred_at, id", (run_id,)
        )

    def resumed_events(self, run_id: str) -> list[dict[str, Any]]:
        """When, by whom and from where the run was resumed (taken over), oldest first."""
        return self.read_dicts(
            "SELECT occurred_at, actor, source FROM events WHERE run_id = ? AND kind = ?"
            " ORDER BY id",
            (run_id, "resumed"),
        )


register(StoreBase=StoreBase)  # what a store= argument takes
