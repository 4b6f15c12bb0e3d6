"""The contract between the store and a database (:class:`Backend`), and where a backend
puts hot-path records instead of committing each (:class:`HotPath`)."""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from .writer import Tx, Writer

__all__ = ["Backend", "HotPath"]


class HotPath(Protocol):
    """Where a backend puts hot-path records instead of committing each (DuckDB: a journal).

    A record is durable once ``record(..., sync=True)`` (or ``sync()``) returned; it is in
    the tables after ``flush()``, which raises ``StoreWriteError`` when it cannot fold now.
    ``record`` returns the record's sequence number; ``settle(seq)`` waits until that record
    is in the tables (True), unless the fold cannot happen now (False at once).
    """

    @property
    def path(self) -> str: ...

    @property
    def unfolded(self) -> bool: ...

    @property
    def quarantined_runs(self) -> set[str]: ...

    def record(self, kind: str, data: dict[str, Any], *, sync: bool) -> int: ...

    def settle(self, seq: int) -> bool: ...

    def sync(self) -> None: ...

    def catch_up(self) -> None: ...

    def fold_first(self) -> None: ...

    def queue_fold(self) -> None: ...

    def flush(self) -> None: ...

    def close_writes(self) -> None: ...

    def close(self) -> None: ...


class Backend(abc.ABC):
    """The contract between the store and a database. ``store/duckdb/`` and
    ``postgres_backend`` implement it; nothing outside a backend branches on which one.

    The abstract methods are the connection; every other hook has a default that is
    right for a backend without that concern.
    """

    dialect: str
    path: str
    read_only: bool = False
    for_update: str = ""  # appended to a SELECT that locks the row until the end of its tx
    for_share: str = ""  # the same, shared: a take-over (FOR UPDATE) waits for it
    fence: Any = None  # per-run fence files (``duckdb/fence.py``) when records are journaled
    inline_limit: int = (1 << 30) - 1  # payloads above it go to ``side_files``
    side_files: Any = None  # a ``SideFiles`` when payloads may live in files beside the store
    foreign_if_any_table: bool = False  # a database with tables but no schema_version is foreign
    on_open: Callable[[], None] | None = None  # set by the writer: the connection (re)opened

    @abc.abstractmethod
    def begin(self) -> Tx: ...

    @abc.abstractmethod
    def commit(self) -> None: ...

    @abc.abstractmethod
    def rollback(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    @abc.abstractmethod
    def read_with_names(
        self, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[tuple[Any, ...]], list[str]]: ...

    @abc.abstractmethod
    def read_arrow(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        allow_files: bool = False,
        timeout: float | None = None,
    ) -> Any: ...

    def try_read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]] | None:
        """A read that may answer ``None`` at once instead of waiting for the database."""
        return self.read(sql, params)

    def bind(self, now: Callable[[], dt.datetime]) -> None:
        """The store's clock, before the first connection opens."""
        self.now = now

    def open_hot_path(self, writer: Writer) -> HotPath | None:
        """Where hot-path records go; None: each is committed directly."""
        return None

    def fold_foreign_tx(self, tx: Tx, run_id: str, *, ends: bool = False) -> None:
        """A take-over: fold what other processes journaled for ``run_id`` and may not have
        folded yet (``ends``: their ``run_end`` records too). Nothing to do without a
        journal."""
        return None

    def waiting_for_file(self) -> bool:
        """A thread of this process waits for its turn at the store file (another process
        holds it). Never, for a server backend."""
        return False

    def idle_tick(self) -> float | None:
        """Called by the idle writer: how long it may sleep (None: until a job comes)."""
        return None

    def change_signal(self) -> Hashable | None:
        """A value that moves whenever any process committed anything, read without a
        query (``_store/changes.py``); None where the backend has none."""
        return None

    def after_batch(self) -> None:
        """Called by the writer after a group commit when nothing else is queued."""
        return None

    def xact_lock(self, tx: Tx, name: str) -> None:
        """Let one transaction at a time past this point for ``name`` (see serialize_tx)."""
        return None

    def is_transient(self, exc: BaseException) -> bool:
        """A transaction that failed with ``exc`` was rolled back and may simply run again."""
        return False

    def is_permanent(self, exc: BaseException) -> bool:
        """The same records would meet ``exc`` again (the tables refuse them)."""
        return False

    @contextlib.contextmanager
    def try_advisory_lock(self, name: str) -> Iterator[bool]:
        """Is this process the one for ``name`` (one sweeper, ...)? Nobody else by default."""
        yield True
