"""A live run's end as its owner records it: one ``run_end`` record.

When a run executing in this process suspends, completes, fails or waits for a decision,
everything that changes with it is one record: the move (through ``transitions.move_tx``,
so the ``runs`` row and its ``events`` row change together), the end of the step left open,
and on entering a final status the release of the run's claims. On DuckDB the record is
journaled like a step's completion, so reaching ``suspended`` never waits for the store
file (another process may hold it for a long ``kx.sql``): the fold applies it once the file
is free, and after a crash the next opener folds it. On PostgreSQL it is applied at once,
in one transaction (``RunsMixin.end_run``).

The deadline of a waiting status is chosen when the record is made (the expiry policy of
the store that made it), so every fold gives the same one. Applying a record twice is as
applying it once: a record whose event is in the table (same run, kind, status and time)
was applied before and is skipped.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import RunNotFound
from ..status import FINAL, LIVE, Status, StepStatus
from .transitions import move_tx
from .writer import Tx

__all__ = [
    "END_STATUSES",
    "REQUIRED_FIELDS",
    "already_applied",
    "apply_run_end",
    "fold_run_end",
    "release_claims_tx",
]

# What an owner's end moves a live run to.
END_STATUSES = frozenset({Status.SUSPENDED, Status.COMPLETED, Status.FAILED, Status.NEEDS_DECISION})
REQUIRED_FIELDS = ("run_id", "status", "kind", "who", "at")


def already_applied(tx: Tx, d: dict[str, Any]) -> bool:
    """This very record was applied before (its move's event is there).

    The move is dated at the record's time or, when another move of the run was dated
    later by the time it was applied, at that one's (``transitions.move_tx``); so: the
    event of this process's move of this kind, to this status, not dated before it."""
    row = tx.fetchone(
        "SELECT 1 FROM events WHERE run_id = ? AND kind = ? AND to_status = ?"
        " AND (occurred_at = ? OR (actor = ? AND occurred_at > ?))",
        (d["run_id"], d["kind"], d["status"], d["at"], d["who"], d["at"]),
    )
    return row is not None


def apply_run_end(tx: Tx, d: dict[str, Any], *, for_update: str = "") -> str:
    """Apply one ``run_end`` record; returns the run's status after it.

    The move is fenced by the record's ``epoch`` (``OwnershipLost`` when the run was taken
    over, nothing changed); a run no longer live (a record of it was quarantined
    meanwhile) keeps its status. The step the record ends is ended either way."""
    if already_applied(tx, d):
        return str(d["status"])
    fields = {"deadline": d["deadline"]} if d.get("deadline") is not None else None
    moved = move_tx(
        tx,
        d["run_id"],
        Status(d["status"]),
        LIVE,
        now=d["at"],
        kind=d["kind"],
        for_update=for_update,
        source=d.get("source"),
        reason=d.get("reason"),
        who=d["who"],
        detail=json.loads(d["detail"]) if d.get("detail") else None,
        fields=fields,
        epoch=d.get("epoch"),
    )
    if d.get("step_id") is not None:
        tx.execute(
            "UPDATE steps SET status = ?, ended_at = ?, duration_s = ?, error = ?, forced = ?"
            " WHERE id = ? AND status = ?",
            (
                d["step_status"],
                d["at"],
                d.get("step_duration_s"),
                d.get("step_error"),
                bool(d.get("step_forced")),
                d["step_id"],
                StepStatus.RUNNING.value,
            ),
        )
    if moved.ok and d["status"] in FINAL and d.get("claims"):
        release_claims_tx(tx, d["run_id"], d["status"], now=d["at"], who=d["who"])
    return str(moved.after)


def fold_run_end(tx: Tx, d: dict[str, Any]) -> None:
    """The fold's way (``records.APPLY``): a run deleted meanwhile has nothing to end."""
    try:
        apply_run_end(tx, d)
    except RunNotFound:
        return


def release_claims_tx(
    tx: Tx, run_id: str, why: str, *, now: Any, who: str, source: str = "engine"
) -> int:
    """Release every claim the run holds, one ``claim_released`` event each; returns how
    many. Claims already released stay as they are (applying twice is as once)."""
    rows = tx.fetchall(
        "UPDATE claims SET released_at = ?, release_reason = ? WHERE run_id = ?"
        " AND released_at IS NULL RETURNING resource, amount",
        (now, why, run_id),
    )
    for resource, amount in rows:
        tx.execute(
            "INSERT INTO events (run_id, occurred_at, kind, from_status, to_status, source,"
            " actor, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                now,
                "claim_released",
                None,
                None,
                source,
                who,
                why,
                json.dumps({"resource": resource, "amount": amount}, default=str, sort_keys=True),
            ),
        )
    return len(rows)
