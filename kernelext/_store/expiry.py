"""Expiry and retention: the SQL behind the sweeper (restart is in ``restart.py``).

* Expiring a run re-checks, inside the transaction, that it is still suspended and
  past its deadline, so two sweepers (or a sweeper and a resume) have one winner.
* Delivery of an expiry to ``kx.on_expire`` callbacks is tracked in
  ``runs.expiry_notified_at``: set once a process's callbacks ran for it (see
  ``core/expiry.py``: at least once).
* After the retention period the payloads of an expired run (blob rows and side
  files) are removed and its snapshots marked ``removed_at``; the run row, steps,
  ledger and events stay as the audit record.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from typing import NamedTuple

from .._formatting import duration_text
from ..errors import IntegrityError
from ..status import WAITING, Status, waiting_reason
from .base import actor, in_list
from .claims import ClaimsMixin
from .run_end import release_claims_tx
from .runs import RunsMixin
from .steps import StepsMixin
from .writer import Tx

__all__ = ["EXPIRY_PREFIX", "WAITING", "Expiry", "ExpiryMixin", "PayloadRemoval"]

EXPIRY_PREFIX = "deadline:"  # an expired run's reason: "deadline:<why it waited>"


class Expiry(NamedTuple):
    run_id: str
    suspend_reason: str
    deadline: dt.datetime
    expired_at: dt.datetime | None = None  # when the expiry was committed (store clock)
    expired_by: str | None = None  # the sweeping process (``actor()``: user@host:pid)


class PayloadRemoval(NamedTuple):
    run_id: str
    snapshots: int
    blobs: int
    bytes: int
    files: int


class ExpiryMixin(ClaimsMixin, StepsMixin, RunsMixin):
    # -- expiry ----------------------------------------------------------------
    def due_for_expiry(self, now: dt.datetime) -> list[str]:
        marks, waiting = in_list(WAITING)  # the paused statuses; both have a deadline
        rows = self.read(
            f"SELECT id FROM runs WHERE status IN {marks}"
            " AND deadline IS NOT NULL"
            " AND deadline <= ? ORDER BY deadline, id",
            (*waiting, now),
        )
        return [str(r[0]) for r in rows]

    def expire_tx(
        self, tx: Tx, run_id: str, now: dt.datetime, *, source: str = "sweeper"
    ) -> Expiry | None:
        """Move one run to ``expired`` if it is still suspended and past its deadline."""
        row = tx.fetchone(
            f"SELECT status, reason, deadline FROM runs WHERE id = ?{self.for_update}", (run_id,)
        )
        if row is None or row[0] not in WAITING or row[2] is None or row[2] > now:
            return None
        # A run waiting for a decision expires as "deadline:decision"; its reason says why.
        suspend_reason = str(waiting_reason(row[0], row[1]))
        deadline: dt.datetime = row[2]
        result = self.transition_tx(
            tx,
            run_id,
            Status.EXPIRED,
            WAITING,
            kind=Status.EXPIRED,
            source=source,
            who=actor(),  # the process that delivers it; a late deliverer checks it is gone
            reason=EXPIRY_PREFIX + suspend_reason,
            detail={
                "deadline": deadline.isoformat(),
                "suspend_reason": suspend_reason,
                "swept_at": now.isoformat(),
            },
        )
        return Expiry(run_id, suspend_reason, deadline) if result.ok else None

    # -- delivery to kx.on_expire callbacks (at least once) ------------------------------
    def undelivered_expiries(self) -> list[Expiry]:
        """Expired runs whose expiry no process delivered to its ``kx.on_expire`` callbacks
        yet (``expiry_notified_at`` is NULL; migration 7 marks older ones), however long
        ago, with when and by which process each expired; oldest expiry first."""
        rows = self.read(
            "SELECT r.id, r.reason, r.deadline, e.occurred_at, e.actor FROM runs r"
            " JOIN events e ON e.run_id = r.id AND e.kind = ?"
            " WHERE r.status = ? AND r.expiry_notified_at IS NULL"
            " ORDER BY e.occurred_at, e.id",
            (Status.EXPIRED, Status.EXPIRED),
        )
        latest: dict[str, Expiry] = {}  # a run expired once; the last event if ever more
        for run_id, reason, deadline, at, who in rows:
            latest[str(run_id)] = Expiry(
                str(run_id),
                str(reason or "").removeprefix(EXPIRY_PREFIX),
                deadline,
                at,
                None if who is None else str(who),
            )
        return sorted(latest.values(), key=lambda e: (e.expired_at or dt.datetime.min, e.run_id))

    def expiry_delivered(self, run_id: str) -> bool:
        """Whether a process recorded delivering the expiry of ``run_id`` to callbacks."""
        rows = self.read("SELECT expiry_notified_at FROM runs WHERE id = ?", (run_id,))
        return bool(rows) and rows[0][0] is not None

    def mark_expiry_notified(self, run_ids: list[str], now: dt.datetime) -> list[str]:
        """Record that this process's callbacks ran for these expired runs; returns the ids
        this call marked (a run another sweep marked meanwhile keeps its time)."""
        if not run_ids:
            return []
        marks, ids = in_list(run_ids)

        def job(tx: Tx) -> list[str]:
            rows = tx.fetchall(
                f"UPDATE runs SET expiry_notified_at = ? WHERE id IN {marks}"
                " AND status = ? AND expiry_notified_at IS NULL RETURNING id",
                (now, *ids, Status.EXPIRED),
            )
            return sorted(str(r[0]) for r in rows)

        marked: list[str] = self.write(job)
        return marked

    def release_run_claims_tx(self, tx: Tx, run_id: str, why: str, source: str = "engine") -> int:
        return release_claims_tx(tx, run_id, why, now=self.now(), who=actor(), source=source)

    def expired_at(self, run_id: str) -> dt.datetime | None:
        rows = self.read(
            "SELECT max(occurred_at) FROM events WHERE run_id = ? AND kind = ?",
            (run_id, Status.EXPIRED),
        )
        return rows[0][0] if rows else None

    # -- retention ---------------------------------------------------------------
    def snapshots_removed_at(self, run_id: str) -> dt.datetime | None:
        rows = self.read("SELECT max(removed_at) FROM snapshots WHERE run_id = ?", (run_id,))
        return rows[0][0] if rows else None

    def retention_due(self, cutoff: dt.datetime) -> list[str]:
        """Expired runs that expired at or before ``cutoff`` and still hold payloads."""
        rows = self.read(
            "SELECT r.id FROM runs r JOIN events e ON e.run_id = r.id AND e.kind = ?"
            " WHERE r.status = ? AND (EXISTS (SELECT 1 FROM snapshots s WHERE"
            " s.run_id = r.id AND s.removed_at IS NULL) OR EXISTS (SELECT 1 FROM blobs b"
            " WHERE b.run_id = r.id)) GROUP BY r.id HAVING max(e.occurred_at) <= ? ORDER BY r.id",
            (Status.EXPIRED, Status.EXPIRED, cutoff),
        )
        return [str(r[0]) for r in rows]

    def remove_payloads(
        self, run_id: str, now: dt.datetime, *, retention_seconds: float, source: str = "sweeper"
    ) -> PayloadRemoval | None:
        """Drop an expired run's blobs and side files; mark its snapshots removed."""

        def job(tx: Tx) -> tuple[PayloadRemoval, list[str]] | None:
            row = tx.fetchone(f"SELECT status FROM runs WHERE id = ?{self.for_update}", (run_id,))
            if row is None or row[0] != Status.EXPIRED:
                return None
            blobs = tx.fetchall(
                "DELETE FROM blobs WHERE run_id = ? RETURNING location, size", (run_id,)
            )
            snaps = tx.fetchall(
                "UPDATE snapshots SET removed_at = ? WHERE run_id = ? AND removed_at IS NULL"
                " RETURNING id",
                (now, run_id),
            )
            files = [str(loc) for loc, _ in blobs if str(loc).startswith("file:")]
            removal = PayloadRemoval(
                run_id, len(snaps), len(blobs), sum(int(size) for _, size in blobs), len(files)
            )
            self.event(
                tx,
                run_id,
                "snapshots_removed",
                source=source,
                reason=f"retention period of {duration_text(retention_seconds)} ended",
                detail={**removal._asdict(), "retention_seconds": retention_seconds},
            )
            return removal, files

        done = self.write(job)
        if done is None:
            return None
        removal, files = done
        # After the commit: a crash leaves an orphan file, never a dangling row.
        if self.backend.side_files is None:  # every payload was inline
            return removal
        for location in files:
            self._remove_side_file(location)
        with contextlib.suppress(OSError):
            os.rmdir(self.blob_dir(run_id))
        return removal

    def _remove_side_file(self, location: str) -> None:
        """Remove a side file found through :meth:`payload_path`, only inside this store's
        blob folder: an old absolute location whose file is not here (a copied project)
        names another store's file, and a location leading out of the folder is refused."""
        try:
            path = self.payload_path(location)
        except IntegrityError:
            return
        if self._files().contains(path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def children(self, run_id: str) -> list[str]:
        rows = self.read("SELECT id FROM runs WHERE parent_id = ? ORDER BY created_at", (run_id,))
        return [str(r[0]) for r in rows]
