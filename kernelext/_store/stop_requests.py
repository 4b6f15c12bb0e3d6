"""Stop requests: recording one (``request_stop``; ``queue_stop_request`` for a run live in
this process), and reading them back (when and by whom, how many forced stops)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from ..status import Status
from .base import actor
from .records import FORCE_REQUESTED, STOP_REQUESTED, apply_record, check_record
from .runs import RunsMixin
from .transitions import Transition
from .writer import Tx

__all__ = ["StopRequestsMixin"]


class StopRequestsMixin(RunsMixin):
    def request_stop(
        self,
        run_id: str,
        *,
        source: str,
        who: str | None = None,
        reason: str | None = None,
        epoch: int | None = None,
    ) -> Transition:
        """Record a stop request. Only the first one moves ``running`` to ``stopping``.

        Waits for the store (and on DuckDB for the file). For a run live in this process
        use ``queue_stop_request``, which never does. ``epoch``: the owner epoch the person
        saw (a fencing token); a run resumed or taken over since raises ``OwnershipLost``,
        checked in the same transaction as the write, and nothing is recorded.
        """

        def job(tx: Tx) -> Transition:
            now = self.now()
            moved = self.transition_tx(
                tx,
                run_id,
                Status.STOPPING,
                (Status.RUNNING,),
                kind=STOP_REQUESTED,
                source=source,
                who=who,
                reason=reason,
                fields={"stop_requested_at": now, "stop_source": source},
                epoch=epoch,
            )
            if not moved.ok:
                self.event(
                    tx,
                    run_id,
                    STOP_REQUESTED,
                    source=source,
                    who=who,
                    reason=reason or f"run already {moved.before}",
                )
            return moved

        return self.write(job)

    def queue_stop_request(
        self, run_id: str, *, source: str, who: str | None = None, reason: str | None = None
    ) -> Callable[[], None]:
        """Queue a stop request for a run live in this process; return what makes it durable.

        Nothing here waits for the store file. On DuckDB the request is appended to this
        process's journal, and its fold is queued in the writer's order, so it lands before
        the suspension the run writes once it sees its stop flag; the returned call
        ``fdatasync``s the journal. On PostgreSQL the request is queued for the writer and
        the returned call waits for its commit. It is applied as ``request_stop`` does.
        """
        data = {
            "run_id": run_id,
            "source": source,
            "who": who or actor(),
            "reason": reason,
            "at": self.now(),
            "request": uuid.uuid4().hex,
        }
        hot_path = self.hot_path
        if hot_path is not None:
            self.record("stop_request", data, sync=False)
            return hot_path.sync
        check_record("stop_request", data)
        queued = self.write_async(lambda tx: apply_record(tx, "stop_request", data))

        def durable() -> None:
            try:
                queued.result()
            except Exception:  # e.g. a deadlock victim: the record is idempotent, write again
                self.record("stop_request", data, sync=True)

        return durable

    def stop_requested_at(self, run_id: str) -> dt.datetime | None:
        rows = self.backend.read("SELECT stop_requested_at FROM runs WHERE id = ?", (run_id,))
        return rows[0][0] if rows else None

    def force_requests(self, run_id: str) -> tuple[int, str | None]:
        """How many times, and first by whom, a forced stop was asked for since the run last
        began executing (``force_requested`` events after its last ``created`` or
        ``resumed`` event, in the order events were written, whatever each writer's clock
        said): how another process's Force stop reaches the process that executes the run."""
        rows = self.backend.read(
            "SELECT source FROM events WHERE run_id = ? AND kind = ? AND id > ("
            " SELECT coalesce(max(id), -1) FROM events WHERE run_id = ?"
            " AND kind IN ('created', 'resumed')) ORDER BY id",
            (run_id, FORCE_REQUESTED, run_id),
        )
        return len(rows), (str(rows[0][0] or "external") if rows else None)

    def stop_request(self, run_id: str, *, wait: bool) -> tuple[Any, Any] | None:
        """(stop_requested_at, stop_source) of a run; None if ``not wait`` and the store is busy.

        For a stop recorded by another process (a terminal, the server route, another
        kernel): those are written by jobs, never journaled here, so no fold is waited for.
        A request this process queued (``queue_stop_request``) may still wait in its
        journal; it raised the run's stop flag directly and is not looked for here.
        """
        sql = "SELECT stop_requested_at, stop_source FROM runs WHERE id = ?"
        if wait:
            rows: list[tuple[Any, ...]] | None = self.backend.read(sql, (run_id,))
        else:
            rows = self.backend.try_read(sql, (run_id,))
        if rows is None:
            return None
        return (rows[0][0], rows[0][1]) if rows else (None, None)
