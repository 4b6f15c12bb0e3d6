"""Stop requests that do not wait for a busy store file (DuckDB; see ``duckdb/mailbox``).

A stop asked from another process while the file's holder keeps it (a long query) is made
durable in a journal file of the asking process's own, and the process that executes the
run reads it from there (``foreign_stops``) within a tick. ``post_stop_at`` does it before
a store is opened (opening needs the file: the command line, the notebook server);
``post_stop_if_busy`` for a store already open. On PostgreSQL nobody holds the store:
both return None and stops are written in the tables as before.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

from .base import StoreBase, actor, utcnow
from .record_door import scrub_record
from .records import check_record

if TYPE_CHECKING:
    from .duckdb.mailbox import ForeignStops, Posted

__all__ = ["PostedStopsMixin", "post_stop_at"]


def stop_record(
    run_id: str, *, source: str, who: str | None, reason: str | None, force: bool, at: dt.datetime
) -> dict[str, Any]:
    """The ``stop_request`` record ``queue_stop_request`` journals (``force`` for a forced
    stop), checked and scrubbed as every journaled record is."""
    data: dict[str, Any] = {
        "run_id": run_id,
        "source": source,
        "who": who or actor(),
        "reason": reason,
        "at": at,
        "request": uuid.uuid4().hex,
    }
    if force:
        data["force"] = True
    check_record("stop_request", data)
    return scrub_record("stop_request", data)


def post_stop_at(
    location: str,
    run_id: str,
    *,
    source: str,
    who: str | None = None,
    reason: str | None = None,
    epoch: int | None = None,
    force: bool = False,
) -> Posted | None:
    """Record a stop of run ``run_id`` in the DuckDB store at ``location`` without opening
    it, if another process keeps the file past a short wait (``mailbox.BUSY_WAIT``); None
    when the file is free, the run is not known there, or ``location`` is PostgreSQL: open
    the store and write the request as usual."""
    if location.startswith(("postgresql://", "postgres://")):
        return None
    from .duckdb.mailbox import post_when_busy_at  # duckdb is imported only for its stores

    data = stop_record(run_id, source=source, who=who, reason=reason, force=force, at=utcnow())
    return post_when_busy_at(location, data, epoch=epoch)


class PostedStopsMixin(StoreBase):
    def post_stop_if_busy(
        self,
        run_id: str,
        *,
        source: str,
        who: str | None = None,
        reason: str | None = None,
        epoch: int | None = None,
        force: bool = False,
    ) -> Posted | None:
        """``post_stop_at`` for this open store: None when the request should be written
        in the tables as usual (the file was free or is held here, or the run is not
        known). Durable when it returns a ``Posted``."""
        poster = getattr(self.backend, "post_stop_when_busy", None)
        if poster is None or self.read_only:
            return None
        data = stop_record(
            run_id, source=source, who=who, reason=reason, force=force, at=self.now()
        )
        posted: Posted | None = poster(data, epoch=epoch)
        return posted

    def foreign_stops(self) -> ForeignStops | None:
        """A reader of the stop requests other processes posted (None: nothing to read)."""
        make = getattr(self.backend, "foreign_stops", None)
        return None if make is None else make()

    def take_foreign_stop(self, data: dict[str, Any]) -> None:
        """Queue a posted stop request into this process's own journal (never waits for the
        file), so that it is folded before the suspension it causes."""
        self.record("stop_request", data, sync=False)
