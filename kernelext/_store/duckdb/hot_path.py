"""This process's hot path on DuckDB: its journal, the fold, and what reads and writes wait for.

The store calls it through the ``HotPath`` contract of ``store/base.py``: ``record`` appends
(and with ``sync`` makes durable), ``catch_up`` lets a read see this process's writes,
``fold_first`` keeps a write behind the records journaled before it, ``flush`` folds
everything or says why it cannot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from ...errors import StoreWriteError
from ..writer import Writer
from .fold import Folder
from .journal import Journal

__all__ = ["JournalHotPath"]

_log = logging.getLogger("kernelext")
STARTS = ("intent", "step_begin")  # records that begin something (a call, a step)
# Records whose fold may wait for the fold interval (``fold.FOLD_INTERVAL``): the steady
# stream of steps and calls. Any other (a run's end, a stop request, a fact) folds at once.
STREAM = frozenset(("step_begin", "step_complete", "item_complete", "intent", "outcome"))
READ_RETRY = 2.0  # seconds between fold attempts made by reads while the store refuses writes
SETTLE_TICK = 0.02  # seconds between looks at the file while a settle waits for its fold


class JournalHotPath:
    def __init__(
        self,
        store_path: str,
        writer: Writer,
        *,
        is_permanent: Callable[[BaseException], bool],
        now: Callable[[], dt.datetime],
        lost: Callable[[], str | None] = lambda: None,
        waiting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.location = store_path
        self.lost = lost  # why the store file is gone, once the backend found out
        self.waiting = waiting  # a thread here waits for another process to let go of the file
        self.writer = writer
        self.journal = Journal(store_path)
        writer.rollback_listeners.append(self.journal.rolled_back)
        self.folder = Folder(self.journal, writer, is_permanent=is_permanent, now=now)
        self._read_retry = 0.0

    @property
    def path(self) -> str:
        return self.journal.path

    @property
    def unfolded(self) -> bool:
        return self.journal.unfolded

    @property
    def quarantined_runs(self) -> set[str]:
        return self.folder.quarantined_runs

    def record(self, kind: str, data: dict[str, Any], *, sync: bool) -> int:
        if kind in STARTS:
            lost = self.lost()
            if lost is not None:  # the store file is gone: start nothing new (what happened
                raise StoreWriteError(lost)  # already, outcomes, is still journaled)
        enqueue = self.folder.schedule if kind in STREAM else self.queue_fold
        return self.journal.append(kind, data, sync=sync, enqueue=enqueue)

    def queue_fold(self) -> None:
        """Queue the fold of what is journaled now, ahead of any job queued after this call
        (the writer runs jobs in order), without waiting for the fold interval."""
        self.folder.schedule(urgent=True)

    def settle(self, seq: int) -> bool:
        """Wait until record ``seq`` is in the tables; True once it is. False at once when
        its fold cannot happen now: another process holds the store file (a long read
        there), or the store refuses writes. The record is durable in the journal either
        way, and the fold applies it once the file is free."""
        journal, folder = self.journal, self.folder
        if journal.folded_seq < seq:
            self.queue_fold()
        while not journal.wait_folded(seq, SETTLE_TICK):
            if folder.fault is not None or folder.parked or folder.closed or self.waiting():
                return journal.folded_seq >= seq
        return True

    def sync(self) -> None:
        self.journal.sync()

    def catch_up(self) -> None:
        """Fold this process's journal before a read; under a fault, read what is there.

        While the store refuses writes, reads try the fold again at most every
        ``READ_RETRY`` seconds (a panel polls): nothing retries in a tight loop.
        """
        if not self.journal.unfolded:
            return
        if self.folder.fault is not None:
            now = time.monotonic()
            if now - self._read_retry < READ_RETRY:
                return
            self._read_retry = now
        with contextlib.suppress(Exception):
            self.flush()

    def fold_first(self) -> None:
        """The journal folds before any other write (the order it was written in): queued
        ahead of it, or after a write fault, folded now (raises while it cannot)."""
        if not self.journal.unfolded:
            return
        if self.folder.fault is not None:
            self.flush()
        else:
            self.queue_fold()

    def flush(self) -> None:
        """Fold every record appended before this call (read-your-writes): records other
        threads append meanwhile are not waited for, so a read during a fast batch returns
        once what it must see is in the tables, never chasing the batch."""
        journal, folder = self.journal, self.folder
        if not journal.unfolded:
            self.writer.run(lambda tx: None)
            return
        target = journal.last_seq
        stalled = 0
        while True:  # a fold that met a refused record goes on one record at a time
            before = journal.folded_seq
            folder.kick()
            self.writer.run(lambda tx: None)
            stalled = stalled + 1 if journal.folded_seq == before else 0
            if journal.folded_seq >= target or folder.fault is not None or stalled >= 3:
                break
        if folder.fault is not None and journal.unfolded:
            raise StoreWriteError(
                f"kernelext cannot write to the store {self.location!r} now "
                f"({folder.fault}); {journal.pending_count} record(s) wait safely in "
                f"{journal.path} and are folded once it takes writes again."
            ) from None

    def close_writes(self) -> None:
        """Before the writer closes: one last fold of what is pending."""
        if self.journal.unfolded:
            self.folder.kick()
        self.folder.close()

    def close(self) -> None:
        """After the writer closed: forget the journal, or keep it for the next open."""
        if self.journal.close():
            _log.warning(
                "kernelext: the store closed with records not yet in its tables; they are "
                "kept in %s and folded when the store is next opened",
                self.journal.path,
            )
