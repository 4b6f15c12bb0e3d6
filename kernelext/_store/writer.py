"""One writer thread that owns the write connection and group-commits queued jobs.

A job is a callable taking a :class:`Tx`. Jobs queued while a commit is running are
executed together in the next transaction. A job's future is resolved only after
its commit has returned, so a record counts as stored only once it is durable. If
a batch fails, it is rolled back and its jobs are retried one by one, so one bad
job never takes its neighbours down with it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from .columns import ScrubbingTx

__all__ = ["Tx", "Writer"]

T = TypeVar("T")


class Tx(Protocol):
    """What a job sees: a connection inside a transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class _Connection(Protocol):
    """The part of a store backend (``base.Backend``) the writer drives."""

    on_open: Callable[[], None] | None

    def begin(self) -> Tx: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...

    def idle_tick(self) -> float | None: ...

    def after_batch(self) -> None: ...


UPKEEP_RETRY: float | None = 1.0  # seconds before a failed upkeep is tried again
_STOP = object()
_WAKE = object()
_log = logging.getLogger("kernelext")


class Writer:
    """Runs jobs on one long-lived connection in one thread, with group commit."""

    def __init__(self, connection: _Connection, name: str = "kernelext-writer") -> None:
        self._conn = connection
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.commits = 0
        self.failures: list[BaseException] = []
        self._upkeep_warned = False
        self.rollback_listeners: list[Callable[[], None]] = []
        connection.on_open = self._wake  # a read opened it: start the idle clock
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[Tx], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(
                    "the kernelext store is closed; open it again with kx.open_store()"
                )
            self._queue.put((job, fut))
        return fut

    def submit_detached(self, job: Callable[[Tx], T]) -> Future[T]:
        """Submit a job nobody waits for; a failure is logged and kept in ``failures``."""
        fut = self.submit(job)
        fut.add_done_callback(self._note_failure)
        return fut

    def _note_failure(self, fut: Future[Any]) -> None:
        exc = fut.exception()
        if exc is not None:
            self.failures.append(exc)
            _log.error("kernelext: a queued store write failed: %r", exc)

    def in_writer_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, job: Callable[[Tx], T]) -> T:
        """Submit a job and wait until its transaction has committed."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a store job cannot wait for another job")
        return self.submit(job).result()

    def _wake(self) -> None:
        self._queue.put(_WAKE)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    # -- the writer thread -------------------------------------------------
    def _loop(self) -> None:
        stopping = False
        while not stopping:
            wait = self._tend(self._conn.idle_tick, UPKEEP_RETRY)
            try:
                first = self._queue.get() if wait is None else self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            batch = [first]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if any(item is _STOP for item in batch):
                stopping = True
            batch = [item for item in batch if item is not _STOP and item is not _WAKE]
            if batch:
                self._run_batch(batch)
            if self._queue.empty():
                self._tend(self._conn.after_batch, None)
        self._tend(self._conn.close, None)

    def _tend(self, upkeep: Callable[[], T], otherwise: T) -> T:
        """The connection's upkeep between jobs (hand the file to a waiting process, let it
        go when idle, close it). Its failure (a file beside the store that cannot be
        opened, ...) never ends this thread, whose queued jobs would wait forever: it is
        logged once as a warning and the writer goes on; a job the store refuses fails
        on its own future."""
        try:
            return upkeep()
        except Exception as exc:
            if not self._upkeep_warned:
                self._upkeep_warned = True
                _log.warning("kernelext: the store's writer goes on, its upkeep failed: %s", exc)
            return otherwise

    def _run_batch(self, batch: list[tuple[Callable[[Tx], Any], Future[Any]]]) -> None:
        live = [(job, fut) for job, fut in batch if fut.set_running_or_notify_cancel()]
        if not live:
            return
        results: list[Any] = []
        try:
            tx = ScrubbingTx(self._conn.begin())  # the one door: every stored value scrubbed
            for job, _ in live:
                results.append(job(tx))
            self._conn.commit()
            self.commits += 1
        except BaseException as exc:
            self._safe_rollback()
            if len(live) == 1:
                live[0][1].set_exception(exc)
                return
            for job, fut in live:
                self._run_one(job, fut)
            return
        for (_, fut), result in zip(live, results, strict=False):
            fut.set_result(result)

    def _run_one(self, job: Callable[[Tx], Any], fut: Future[Any]) -> None:
        try:
            tx = ScrubbingTx(self._conn.begin())
            result = job(tx)
            self._conn.commit()
            self.commits += 1
        except BaseException as exc:  # the caller decides; the writer must survive
            self._safe_rollback()
            fut.set_exception(exc)
            return
        fut.set_result(result)

    def _safe_rollback(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.rollback()
        for listener in self.rollback_listeners:
            listener()
