"""The ``stop_request`` record: a stop (or a forced stop) asked of a run, as it is folded
into the tables from a journal (``records.APPLY``), its own or one posted beside a busy
store (``duckdb/mailbox``)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import RunNotFound
from ..status import Status
from .transitions import move_tx
from .writer import Tx

__all__ = ["FORCE_REQUESTED", "STOP_REQUESTED", "stop_request"]

STOP_REQUESTED = "stop_requested"  # the event kind of every stop request
FORCE_REQUESTED = "force_requested"  # a forced stop asked for (the stop is requested too)
_STOP_EVENT = (
    "INSERT INTO events (run_id, occurred_at, kind, from_status, to_status, source, actor,"
    " reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def stop_request(tx: Tx, d: dict[str, Any]) -> None:
    """A stop asked of a run live in the journaling process (see
    ``StopRequestsMixin.request_stop``).

    The first request moves ``running`` to ``stopping``; every request adds one
    ``stop_requested`` event, and a forced one (``force``) a ``force_requested`` event
    while the run is live. The event carries the request's id, and a request whose
    event is already there is skipped: folding a journal again after a crash is harmless.
    (Not its time: a move is dated after the run's last one, see ``move_tx``.)
    """
    detail = json.dumps({"request": d["request"]}, sort_keys=True)
    if tx.fetchone(
        "SELECT 1 FROM events WHERE run_id = ? AND kind = ? AND detail = ?",
        (d["run_id"], STOP_REQUESTED, detail),
    ):
        return
    try:
        moved = move_tx(
            tx,
            d["run_id"],
            Status.STOPPING,
            (Status.RUNNING,),
            now=d["at"],
            kind=STOP_REQUESTED,
            source=d["source"],
            who=d["who"],
            reason=d.get("reason"),
            detail={"request": d["request"]},
            fields={"stop_requested_at": d["at"], "stop_source": d["source"]},
        )
    except RunNotFound:  # the run was deleted meanwhile: nothing left to stop
        return
    if not moved.ok:
        reason = d.get("reason") or f"run already {moved.before}"
        tx.execute(
            _STOP_EVENT,
            (
                d["run_id"],
                d["at"],
                STOP_REQUESTED,
                None,
                None,
                d["source"],
                d["who"],
                reason,
                detail,
            ),
        )
    if d.get("force") and (moved.ok or moved.before == Status.STOPPING):
        tx.execute(  # a forced stop (posted while the store was busy): as ``force_stop`` writes
            _STOP_EVENT,
            (
                d["run_id"],
                d["at"],
                FORCE_REQUESTED,
                None,
                None,
                d["source"],
                d["who"],
                None,
                detail,
            ),
        )
