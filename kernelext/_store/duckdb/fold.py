"""Folding journal records into the tables, without ever dropping one.

One fold job drains everything pending in one transaction, with one ``journal_state``
write; appends made while a fold is queued ride along with it. A fold costs DuckDB about
the same whether it holds 5 records or 500 (a handful of statements and a commit), so while
records keep coming, a fold waits until ``FOLD_INTERVAL`` has passed since the previous one
ended (or until ``FOLD_RECORDS`` are pending): the first record after a quiet spell folds at
once, a steady stream folds in batches. Nothing acknowledged waits for a fold (a record is
stored once its ``fdatasync`` returned), and anything that must see the tables folds first
and at once (``schedule(urgent=True)``): a read of this process (read-your-writes), any
other write (the writer's order), a run's end waited for, a stop request, a flush and a
close. When a fold fails:

- for a **transient** reason (disk full, out of memory, the file busy), it is retried
  with backoff, then parked until the next flush, read or close; the records stay in
  memory and in the journal file, so nothing is lost even if the process dies;
- for a **permanent** reason (the tables refuse a record), records are folded one at a
  time until the refused one is found; it goes to the ``quarantine`` table with an
  ``events`` row and one log line, and its run moves to ``needs_decision``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from ...errors import RunNotFound
from ...status import LIVE, Status
from ..columns import scrubbed_excerpt
from ..records import APPLY
from ..transitions import move_tx
from ..writer import Tx, Writer
from .bulk import apply_records
from .journal import Journal, Record, encode_payload

__all__ = ["Folder", "quarantine_tx", "refuse_tx", "set_journal_state"]

_log = logging.getLogger("kernelext")
BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # then parked until a flush, read or close
FOLD_INTERVAL = 0.04  # seconds between the folds of a steady stream of records
FOLD_RECORDS = 2_000  # this many records pending fold at once, whatever the interval
_QUARANTINE_NS = uuid.UUID("6b1f4d1e-8f43-4a5e-9a57-6b2f0c1d7e11")


def set_journal_state(tx: Tx, journal_id: str, last_seq: int) -> None:
    """Note how far ``journal_id`` is folded: an UPDATE of its row, inserted the first
    time (DuckDB's ``ON CONFLICT DO UPDATE`` costs several times more, at every fold)."""
    updated = tx.fetchone(
        "UPDATE journal_state SET last_seq = ? WHERE journal_id = ? RETURNING journal_id",
        (last_seq, journal_id),
    )
    if updated is None:
        tx.execute(
            "INSERT INTO journal_state (journal_id, last_seq) VALUES (?, ?)", (journal_id, last_seq)
        )


def quarantine_tx(
    tx: Tx,
    now: dt.datetime,
    *,
    journal_id: str,
    seq: int | None,
    kind: str,
    payload: str,
    error: str,
    file: str,
    run_id: str | None,
    marker: str = "",
    hold: bool = True,
) -> None:
    """Keep a refused record where a person sees it, and hold its run for a decision
    (``hold=False``: a stale owner's record; the run's current owner goes on)."""
    qid = uuid.uuid5(_QUARANTINE_NS, f"{journal_id}\0{seq}\0{marker}")
    inserted = tx.fetchone(
        "INSERT INTO quarantine (id, journal_id, seq, kind, run_id, payload, error, file,"
        " quarantined_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
        " RETURNING id",
        (qid, journal_id, seq, kind, run_id, payload, scrubbed_excerpt(error, 2000), file, now),
    )
    if inserted is None:
        return  # quarantined before (a journal folded twice after a crash)
    detail = json.dumps({"quarantine_id": str(qid), "journal": journal_id, "seq": seq})
    tx.execute(
        "INSERT INTO events (run_id, occurred_at, kind, source, actor, reason, detail)"
        " VALUES (?, ?, 'record_quarantined', 'store', 'kernelext', ?, ?)",
        (run_id, now, f"{kind} record refused: {scrubbed_excerpt(error, 300)}", detail),
    )
    if run_id is None or not hold:
        return
    reason = (
        f"a {kind} record was refused by the store and quarantined ({scrubbed_excerpt(error, 200)})"
        if kind != "(damage)"
        else scrubbed_excerpt(error, 500)
    )
    try:
        move_tx(
            tx,
            run_id,
            Status.NEEDS_DECISION,
            (*LIVE, Status.SUSPENDED),
            now=now,
            kind=Status.NEEDS_DECISION,
            source="store",
            reason=reason,
            detail=json.loads(detail),
            actor="kernelext",
        )
    except RunNotFound:
        return


def refuse_tx(
    tx: Tx, now: dt.datetime, *, journal_id: str, file: str, records: list[Record]
) -> None:
    """Keep the records the fold refused (``bulk.apply_records``): a stale owner's, or an
    intent whose key another call wrote. Quarantined with an ``events`` row each; the run
    is not held (it belongs to someone else now)."""
    for record in records:
        seq, kind, data = record
        run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None
        quarantine_tx(
            tx,
            now,
            journal_id=journal_id,
            seq=seq,
            kind=kind,
            payload=record_payload(record),
            error=(
                f"written under ownership epoch {data.get('epoch')}, which is over (the run"
                " was taken over), or a second call with an intent's key"
            ),
            file=file,
            run_id=run_id,
            hold=False,
        )
        _log.error(
            "kernelext: journal record %s (%s) of run %s was refused (its writer no longer "
            "owns the run) and kept in quarantine.",
            seq,
            kind,
            run_id,
        )


def record_payload(record: Record) -> str:
    seq, kind, data = record
    try:
        return encode_payload(seq, kind, data).decode()
    except (TypeError, ValueError):
        return repr(record)[:100_000]


class Folder:
    """Folds this process's journal through the writer thread."""

    def __init__(
        self,
        journal: Journal,
        writer: Writer,
        *,
        is_permanent: Callable[[BaseException], bool],
        now: Callable[[], dt.datetime],
    ) -> None:
        self.journal = journal
        self.writer = writer
        self.is_permanent = is_permanent
        self.now = now
        self._lock = threading.Lock()
        self._queued = False
        self._timer: threading.Timer | None = None  # a retry after a transient failure
        self._due: threading.Timer | None = None  # the next fold of a steady stream
        self._last_end = -FOLD_INTERVAL  # time.monotonic() when the last fold job ended
        self._attempt = 0
        self._single_until = 0  # fold one record at a time up to this seq (finding a bad one)
        self.parked = False
        self.fault: BaseException | None = None  # the transient failure, while it lasts
        self.quarantined_runs: set[str] = set()
        self._taken: list[Record] = []  # what the last fold job took (writer thread)
        self._poisoned: dict[int, BaseException] = {}  # seq -> why the tables refused it
        self.closed = False

    # -- scheduling ----------------------------------------------------------------
    def schedule(self, *, urgent: bool = False) -> None:
        """Queue one fold, unless one is queued, a retry waits, or folding is parked.

        Not ``urgent`` (a record appended): less than ``FOLD_INTERVAL`` after the previous
        fold ended, the fold waits for the rest of the interval, unless ``FOLD_RECORDS``
        are pending.
        """
        with self._lock:
            if self._queued or self._timer is not None or self.parked or self.closed:
                return
            now = time.monotonic()
            wait = self._last_end + FOLD_INTERVAL - now
            journal = self.journal
            if not urgent and wait > 0 and journal.last_seq - journal.folded_seq < FOLD_RECORDS:
                if self._due is None:
                    self._due = threading.Timer(wait, self._fold_due)
                    self._due.daemon = True
                    self._due.start()
                return
            due, self._due = self._due, None
            self._queued = True
        if due is not None:
            due.cancel()
        try:
            fut = self.writer.submit(self._fold)
        except RuntimeError:  # the writer closed meanwhile: the journal file keeps them
            with self._lock:
                self._queued = False
            return
        fut.add_done_callback(self._done)

    def _fold_due(self) -> None:
        with self._lock:
            self._due = None
        self.schedule(urgent=True)

    def kick(self) -> None:
        """Try again now (a flush, a read or close): lift a park or a pending backoff."""
        with self._lock:
            timer, self._timer = self._timer, None
            self.parked = False
        if timer is not None:
            timer.cancel()
        self.schedule(urgent=True)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            timer, self._timer = self._timer, None
            due, self._due = self._due, None
        for waiting in (timer, due):
            if waiting is not None:
                waiting.cancel()

    # -- the fold job (writer thread) ------------------------------------------------
    def _fold(self, tx: Tx) -> int:
        with self._lock:
            self._queued = False
            single = self._single_until
        records = self.journal.take(limit=1 if single else None)
        self._taken = records
        if not records:  # what a take-over applied (``fold_in``) is marked once committed
            applied, folded = self.journal.applied_seq, self.journal.folded_seq
            return applied if applied > folded else 0
        refused = self._poisoned.get(records[0][0]) if single else None
        if refused is not None:  # found before: keep it in quarantine instead
            self._quarantine(tx, records[0], refused)
        else:
            stale = apply_records(tx, records)
            if stale:
                refuse_tx(
                    tx,
                    self.now(),
                    journal_id=self.journal.id,
                    file=self.journal.path,
                    records=stale,
                )
        last = records[-1][0]
        set_journal_state(tx, self.journal.id, last)
        return last

    def fold_in(self, tx: Tx) -> None:
        """Apply every record journaled so far inside the writer's current job: a take-over
        made by this process, once it holds the fence, so that its own records of the epoch
        it ends are in the tables before the epoch moves (as another process's are), never
        refused later as stale. The fold job queued here marks them folded once this
        transaction committed (a rollback has them applied again)."""
        with self._lock:
            if self._single_until or self.fault is not None or self.closed:
                return  # the next fold goes on as it would (one at a time, or retried)
        records = self.journal.take()
        if not records:
            return
        stale = apply_records(tx, records)
        if stale:
            refuse_tx(
                tx, self.now(), journal_id=self.journal.id, file=self.journal.path, records=stale
            )
        set_journal_state(tx, self.journal.id, records[-1][0])
        self.schedule(urgent=True)

    def _done(self, fut: Future[int]) -> None:
        self._last_end = time.monotonic()
        exc = fut.exception()
        if exc is None:
            self._succeeded(fut.result())
            return
        with self._lock:
            self._queued = False  # it may have failed before it ran (the file busy)
        if self.is_permanent(exc):
            self._refused(exc)
        else:
            self._transient(exc)

    def _succeeded(self, last: int) -> None:
        if last:
            self.journal.folded(last)
        with self._lock:
            recovered = self.fault is not None
            self.fault = None
            self._attempt = 0
            if self._single_until and self.journal.folded_seq >= self._single_until:
                self._single_until = 0
            more = self.journal.unfolded and (self._single_until or recovered)
        if recovered:
            _log.warning("kernelext: the journal folds into the store again")
        if more:
            self.schedule(urgent=True)

    def _transient(self, exc: BaseException) -> None:
        with self._lock:
            first = self.fault is None
            self.fault = exc
            self._attempt += 1
            attempt = self._attempt
            if attempt > len(BACKOFF):
                self.parked = True
            elif not self.closed:
                self._timer = threading.Timer(BACKOFF[attempt - 1], self._retry)
                self._timer.daemon = True
                self._timer.start()
        if first:
            _log.error(
                "kernelext: folding the journal into the store failed (%s); %d record(s) are "
                "kept in %s and folding is retried",
                exc,
                self.journal.pending_count,
                self.journal.path,
            )
        elif attempt == len(BACKOFF) + 1:
            _log.error(
                "kernelext: the store still refuses writes (%s); folding waits for the next "
                "read, flush or close. The records are safe in %s.",
                exc,
                self.journal.path,
            )

    def _retry(self) -> None:
        with self._lock:
            self._timer = None
        self.schedule(urgent=True)

    def _refused(self, exc: BaseException) -> None:
        """A permanent failure: fold one record at a time; quarantine the one refused."""
        with self._lock:
            taken, self._taken = self._taken, []
            stuck = bool(self._single_until) and (
                not taken or taken[0][0] in self._poisoned  # even quarantining it failed
            )
            if not self._single_until:
                self._single_until = self.journal.last_seq
            elif not stuck:
                self._poisoned[taken[0][0]] = exc
        if stuck:  # the store itself is broken (a table gone, ...): back off, never spin
            self._transient(exc)
            return
        self.schedule(urgent=True)

    def _quarantine(self, tx: Tx, record: Record, exc: BaseException) -> None:
        seq, kind, data = record
        run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None
        quarantine_tx(
            tx,
            self.now(),
            journal_id=self.journal.id,
            seq=seq,
            kind=kind,
            payload=record_payload(record),
            error=f"{type(exc).__name__}: {exc}",
            file=self.journal.path,
            run_id=run_id,
        )
        self._poisoned.pop(seq, None)
        if run_id is not None:
            self.quarantined_runs.add(run_id)
        _log.error(
            "kernelext: journal record %s (%s) of run %s was refused by the store and "
            "quarantined: %s. See kx.sql('SELECT * FROM quarantine').",
            seq,
            kind,
            run_id,
            exc,
        )


def known_and_unknown(records: list[Record]) -> tuple[list[Record], list[Record]]:
    known = [r for r in records if r[1] in APPLY]
    return known, [r for r in records if r[1] not in APPLY]
