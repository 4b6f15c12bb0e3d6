"""Heartbeats of item attempts in other processes (``steps.heartbeat_at``).

A ``run.map`` item run by a worker (a Dask worker, a process pool's child) outlives the
owner that dispatched it: a notebook SIGKILLed or taken over leaves its workers inside their
calls. While a worker runs an item attempt it renews the heartbeat of the attempt's step
every few seconds (``_core/batch/heartbeat.py``); a take-over asks no probe for an item
whose heartbeat is fresh, since that worker may still be making the call the probe would
answer "not arrived" for. The heartbeat is a fact about a process, not a record of the run:
it is written unfenced (a stale owner's worker is exactly the one that must be seen) and
only ever moves that one column.

Times are the store's clock (``Store.now``), as leases are: the processes of a team's store
keep their clocks in step.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection

from .base import StoreBase
from .writer import Tx

__all__ = ["HEARTBEAT_LAPSE_SECONDS", "HeartbeatsMixin"]

# A worker renews every few seconds (remote_heartbeat.BEAT_SECONDS); one not heard of for
# this long is gone (SIGKILLed, its machine lost) or frozen.
HEARTBEAT_LAPSE_SECONDS = 15.0


LIVE_KEYS = "SELECT DISTINCT key FROM steps WHERE run_id = ? AND heartbeat_at > ?"


class HeartbeatsMixin(StoreBase):
    def beat_steps(self, run_id: str, step_ids: Collection[uuid.UUID]) -> None:
        """Renew the heartbeat of these step attempts of ``run_id`` (a worker is running
        them). The run's row is locked shared first, as every write of a run's records
        locks it before its steps: a take-over (which locks it for update, then abandons
        the steps) and a heartbeat are ordered, never deadlocked."""
        if not step_ids:
            return
        ids = list(step_ids)
        marks = ", ".join("?" for _ in ids)
        at, lock = self.now(), self.backend.for_share

        def job(tx: Tx) -> None:
            tx.fetchone(f"SELECT 1 FROM runs WHERE id = ?{lock}", (run_id,))
            tx.execute(
                f"UPDATE steps SET heartbeat_at = ? WHERE run_id = ? AND id IN ({marks})",
                (at, run_id, *ids),
            )

        self.write(job)

    def live_item_keys_tx(self, tx: Tx, run_id: str) -> set[str]:
        """Step keys of ``run_id`` whose attempt a worker is still running (a heartbeat
        younger than ``HEARTBEAT_LAPSE_SECONDS``): its calls may still be in flight."""
        return {str(row[0]) for row in tx.fetchall(LIVE_KEYS, (run_id, self._lapsed()))}

    def live_item_keys(self, run_id: str) -> set[str]:
        """``live_item_keys_tx`` outside a transaction."""
        return {str(row[0]) for row in self.read(LIVE_KEYS, (run_id, self._lapsed()))}

    def _lapsed(self) -> dt.datetime:
        return self.now() - dt.timedelta(seconds=HEARTBEAT_LAPSE_SECONDS)
