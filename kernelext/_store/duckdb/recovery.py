"""Folding the journals of processes that died, on every connect, without locking anyone out.

Each orphaned journal is read frame by frame. Its intact records are folded in one
transaction; if the tables refuse one, one at a time, and the refused record is
quarantined. A record of a kind this release does not know, and a payload that cannot be
read, are quarantined too. Damaged bytes (a flipped bit, garbage in the middle) are
skipped: the records before and after them are folded, the file is moved to
``<store>.quarantine/`` for inspection, and the damage is listed in ``quarantine``. A
transient failure leaves the file where it is, to be folded at the next connect; the
store still opens.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
from collections.abc import Callable
from typing import Any

from ..writer import Tx
from .bulk import apply_records
from .fold import known_and_unknown, quarantine_tx, record_payload, refuse_tx, set_journal_state
from .journal import Record, Scan, orphaned_journals, scan_journal
from .store_files import own_folder

__all__ = ["fold_orphaned_journals"]

_log = logging.getLogger("kernelext")


def fold_orphaned_journals(
    run_tx: Callable[[Callable[[Tx], Any]], Any],
    store_path: str,
    own: str | None,
    *,
    now: Callable[[], dt.datetime],
    is_permanent: Callable[[BaseException], bool],
) -> None:
    exists = run_tx(
        lambda tx: tx.fetchone(
            "SELECT 1 FROM information_schema.tables WHERE table_name = 'journal_state'"
        )
    )
    if not exists:
        return
    for journal_id, path, fd in orphaned_journals(store_path, own):
        try:
            _recover(run_tx, store_path, journal_id, path, now, is_permanent)
        except Exception as exc:
            if is_permanent(exc):
                raise
            _log.error(
                "kernelext: could not fold the journal %s of a process that ended (%s); it is "
                "kept and folded at the next open",
                path,
                exc,
            )
        finally:
            os.close(fd)


def _recover(
    run_tx: Callable[[Callable[[Tx], Any]], Any],
    store_path: str,
    journal_id: str,
    path: str,
    now: Callable[[], dt.datetime],
    is_permanent: Callable[[BaseException], bool],
) -> None:
    scan = scan_journal(path)
    row = run_tx(
        lambda tx: tx.fetchone(
            "SELECT last_seq FROM journal_state WHERE journal_id = ?", (journal_id,)
        )
    )
    last = int(row[0]) if row else 0
    known, unknown = known_and_unknown([r for r in scan.records if r[0] > last])
    _fold_records(run_tx, journal_id, path, known, now, is_permanent)
    for record in unknown:
        _quarantine(
            run_tx, journal_id, path, record, "a record kind this release does not know", now
        )
    kept = _note_damage(run_tx, store_path, journal_id, path, scan, now)
    run_tx(lambda tx: tx.execute("DELETE FROM journal_state WHERE journal_id = ?", (journal_id,)))
    if not kept:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _fold_records(
    run_tx: Callable[[Callable[[Tx], Any]], Any],
    journal_id: str,
    path: str,
    records: list[Record],
    now: Callable[[], dt.datetime],
    is_permanent: Callable[[BaseException], bool],
) -> None:
    if not records:
        return

    def bulk(tx: Tx) -> None:
        refused = apply_records(tx, records)
        refuse_tx(tx, now(), journal_id=journal_id, file=path, records=refused)
        set_journal_state(tx, journal_id, records[-1][0])

    try:
        run_tx(bulk)
        return
    except Exception as exc:
        if not is_permanent(exc):
            raise
    for record in records:  # find the refused ones; fold the others
        try:
            run_tx(_one(journal_id, path, record, now))
        except Exception as exc:
            if not is_permanent(exc):
                raise
            _quarantine(run_tx, journal_id, path, record, f"{type(exc).__name__}: {exc}", now)


def _one(
    journal_id: str, path: str, record: Record, now: Callable[[], dt.datetime]
) -> Callable[[Tx], None]:
    def job(tx: Tx) -> None:
        refused = apply_records(tx, [record])
        refuse_tx(tx, now(), journal_id=journal_id, file=path, records=refused)
        set_journal_state(tx, journal_id, record[0])

    return job


def _quarantine(
    run_tx: Callable[[Callable[[Tx], Any]], Any],
    journal_id: str,
    path: str,
    record: Record,
    error: str,
    now: Callable[[], dt.datetime],
) -> None:
    seq, kind, data = record
    run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None

    def job(tx: Tx) -> None:
        quarantine_tx(
            tx,
            now(),
            journal_id=journal_id,
            seq=seq,
            kind=kind,
            payload=record_payload(record),
            error=error,
            file=path,
            run_id=run_id,
        )
        set_journal_state(tx, journal_id, seq)

    run_tx(job)
    _log.error(
        "kernelext: record %s (%s) of run %s in journal %s was quarantined: %s. "
        "See kx.sql('SELECT * FROM quarantine').",
        seq,
        kind,
        run_id,
        path,
        error,
    )


def _note_damage(
    run_tx: Callable[[Callable[[Tx], Any]], Any],
    store_path: str,
    journal_id: str,
    path: str,
    scan: Scan,
    now: Callable[[], dt.datetime],
) -> bool:
    """Record damaged stretches and unreadable payloads; move a damaged file aside."""
    if not scan.damage and not scan.unreadable:
        return False
    folder = store_path + ".quarantine"
    own_folder(folder)  # 0700, never a link
    kept = os.path.join(folder, f"journal.{journal_id}")
    for offset, end, why in scan.damage:
        error = f"{end - offset} damaged byte(s) at offset {offset}: {why}"
        _quarantine_note(run_tx, journal_id, kept, f"(damage)@{offset}", error, now)
    for offset, text, why in scan.unreadable:
        _quarantine_note(
            run_tx,
            journal_id,
            kept,
            f"(unreadable)@{offset}",
            why,
            now,
            kind="(unreadable)",
            payload=text,
        )
    # Records of these runs may be in the damaged bytes (an intent, say): each waits for
    # a person to check it against the outside world before it goes on.
    runs = sorted({d["run_id"] for _, _, d in scan.records if isinstance(d.get("run_id"), str)})
    where = ", ".join(str(offset) for offset, _, _ in scan.damage) or "unreadable records"
    for run_id in runs:
        error = (
            f"the journal {os.path.basename(path)} was damaged (at {where}); records of this "
            "run may be missing there. Check its effects against the systems they reached "
            "(kx.sql on effects), then resume it deliberately with kx.resume."
        )
        _quarantine_note(run_tx, journal_id, kept, f"run:{run_id}", error, now, run_id=run_id)
    os.replace(path, kept)
    _log.error(
        "kernelext: the journal %s was damaged; the intact records were folded and the file "
        "is kept as %s. See kx.sql('SELECT * FROM quarantine').",
        path,
        kept,
    )
    return True


def _quarantine_note(
    run_tx: Callable[[Callable[[Tx], Any]], Any],
    journal_id: str,
    file: str,
    marker: str,
    error: str,
    now: Callable[[], dt.datetime],
    *,
    kind: str = "(damage)",
    payload: str = "",
    run_id: str | None = None,
) -> None:
    """One quarantine row about the file, not a record (``marker`` keeps it unique)."""

    def job(tx: Tx) -> None:
        quarantine_tx(
            tx,
            now(),
            journal_id=journal_id,
            seq=None,
            kind=kind,
            payload=payload,
            error=error,
            file=file,
            run_id=run_id,
            marker=marker,
        )

    run_tx(job)
