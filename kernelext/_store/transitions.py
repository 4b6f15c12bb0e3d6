"""The one place a run's status changes: ``move_tx``.

It locks the run row, checks the move against ``kernelext.status.TRANSITIONS``, sets
the deadline of a waiting status from the expiry policy (unless the caller gives one),
clears it when the run runs again, updates the row and writes the ``events`` row, all in
the caller's transaction. A move is dated at the caller's time or, if the run's row was
written later meanwhile, at that time: a run's history reads in the order of its moves.
``RunsMixin.transition_tx`` is the store's front door to it;
the fold of a dead process's journal (which has no store object yet) calls it directly.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from .._expiry_policy import POLICY, ExpiryPolicy
from ..errors import OwnershipLost, RunNotFound
from ..status import WAITING, Status, check_transition, waiting_reason
from .observe import OBSERVERS, notify
from .writer import Tx

__all__ = ["Transition", "move_tx"]


class Transition(NamedTuple):
    ok: bool
    before: str | None
    after: str | None


def move_tx(
    tx: Tx,
    run_id: str,
    to_status: Status,
    allowed_from: Iterable[str],
    *,
    now: dt.datetime,
    kind: str,
    for_update: str = "",
    policy: ExpiryPolicy = POLICY,
    source: str | None = None,
    reason: str | None = None,
    who: str | None = None,
    detail: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    actor: str | None = None,
    location: str = "",
    epoch: int | None = None,
) -> Transition:
    """Move run ``run_id`` to ``to_status`` if it is in one of ``allowed_from`` (the
    caller's precondition); a move the transition table forbids raises ``RunStateError``.

    ``fields``: other run columns to set in the same UPDATE. ``reason`` is written to the
    row (unless ``fields`` sets it) and to the event. Returns what the status was and is.
    ``epoch``: the caller owns the run at this ownership epoch; if it was taken over since,
    ``OwnershipLost`` is raised and nothing changes (the compare-and-set includes it).
    """
    allowed = {str(status) for status in allowed_from}
    while True:
        row = tx.fetchone(
            f"SELECT status, owner_epoch, owner, updated_at FROM runs WHERE id = ?{for_update}",
            (run_id,),
        )
        if row is None:
            where = f" at {location}" if location else ""
            raise RunNotFound(f"No run {run_id!r} in the store{where}.")
        before = str(row[0])
        if epoch is not None and row[1] != epoch:
            raise OwnershipLost(
                run_id, owner=row[2], epoch=row[1], held=epoch, what=f"move to {to_status}"
            )
        if before not in allowed:
            return Transition(False, before, before)
        check_transition(run_id, before, to_status)
        # The caller read its clock before it held the row: a move committed meanwhile may
        # be later. A run's moves are dated in the order they were made, never before it.
        now = _not_before(now, row[3])
        updates = _updates(to_status, now, reason, fields, policy)
        assignments = ", ".join(f"{name} = ?" for name in updates)
        # Compare and set: a move another transaction made meanwhile is seen, not overwritten.
        fenced = " AND owner_epoch = ?" if epoch is not None else ""
        moved = tx.fetchone(
            f"UPDATE runs SET {assignments} WHERE id = ? AND status = ?{fenced} RETURNING id",
            (*updates.values(), run_id, before, *((epoch,) if epoch is not None else ())),
        )
        if moved is not None:
            break
    _record_move(
        tx,
        run_id,
        before,
        to_status,
        now=now,
        kind=kind,
        source=source,
        reason=reason,
        who=who or actor,
        detail=detail,
        deadline_given="deadline" in (fields or {}),
        updates=updates,
    )
    return Transition(True, before, Status(to_status))


def _record_move(
    tx: Tx,
    run_id: str,
    before: str,
    to_status: Status,
    *,
    now: dt.datetime,
    kind: str,
    source: str | None,
    reason: str | None,
    who: str | None,
    detail: dict[str, Any] | None,
    deadline_given: bool,
    updates: dict[str, Any],
) -> None:
    """The ``events`` row of a move (in the same transaction), and the observers told."""
    detail = dict(detail or {})
    computed = not deadline_given and isinstance(updates.get("deadline"), dt.datetime)
    if to_status == Status.SUSPENDED and computed:  # the policy chose it: say which
        detail.setdefault("deadline", updates["deadline"].isoformat())
    tx.execute(
        "INSERT INTO events (run_id, occurred_at, kind, from_status, to_status, source,"
        " actor, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            now,
            str(kind),
            before,
            Status(to_status).value,
            source,
            who,
            reason,  # reason and detail: scrubbed by the write path (store/columns.py)
            json.dumps(detail, sort_keys=True, default=str) if detail else None,
        ),
    )
    if OBSERVERS:
        notify(
            "transition",
            {
                "run_id": run_id,
                "kind": str(kind),
                "from_status": before,
                "to_status": Status(to_status).value,
                "source": source,
                "reason": reason,
                "at": now,
            },
        )


def _not_before(now: dt.datetime, last: Any) -> dt.datetime:
    if not isinstance(last, dt.datetime) or (last.tzinfo is None) != (now.tzinfo is None):
        return now
    return max(now, last)


def _updates(
    to_status: Status,
    now: dt.datetime,
    reason: str | None,
    fields: dict[str, Any] | None,
    policy: ExpiryPolicy,
) -> dict[str, Any]:
    updates: dict[str, Any] = {"status": Status(to_status).value, "updated_at": now}
    fields = dict(fields or {})
    if reason is not None or "reason" not in fields:
        updates["reason"] = reason
    if to_status in WAITING and "deadline" not in fields:
        fields["deadline"] = policy.deadline(
            waiting_reason(to_status, fields.get("reason", reason)), now
        )
    elif to_status == Status.RUNNING:
        fields.setdefault("deadline", None)
    updates.update(fields)
    return updates
