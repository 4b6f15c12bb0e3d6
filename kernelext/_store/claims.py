"""Claims: resources a run holds (a lock, reserved budget, a slot) until it ends.

A claim is exclusive per resource string: while a run that is live or paused
(``HOLDING``) holds an unreleased claim on a resource, no other run can claim it.
Claiming again from the same run is idempotent (resume replays the call). Claimers
of one resource take turns (``serialize_tx``), so two processes sharing a
PostgreSQL store never both win it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NamedTuple

from .._formatting import moment_text
from ..errors import ClaimConflict
from ..status import LIVE, WAITING, Status
from .base import StoreBase, in_list
from .runs import RunsMixin
from .writer import Tx

__all__ = ["HOLDING", "ClaimRow", "ClaimsMixin"]

# A claim blocks others only while its run can still go on.
HOLDING = LIVE | WAITING


class ClaimRow(NamedTuple):
    id: uuid.UUID
    resource: str
    run_id: str
    amount: float | None
    claimed_at: dt.datetime
    new: bool  # False when the run already held it (idempotent repeat)


class ClaimsMixin(RunsMixin, StoreBase):
    def claim_tx(
        self, tx: Tx, run_id: str, resource: str, amount: float | None, *, source: str = "agent"
    ) -> ClaimRow:
        """Take ``resource`` for ``run_id`` inside the caller's transaction.

        Raises :class:`ClaimConflict` naming the holder when another holding run has it.
        """
        self.serialize_tx(tx, f"kernelext:claim:{resource}")  # one claimer at a time
        mine = tx.fetchone(
            "SELECT id, amount, claimed_at FROM claims WHERE run_id = ? AND resource = ?"
            f" AND released_at IS NULL ORDER BY claimed_at LIMIT 1{self.for_update}",
            (run_id, resource),
        )
        if mine is not None:
            held_amount = mine[1]
            if amount is not None and held_amount is not None and float(amount) != held_amount:
                raise ClaimConflict(
                    f"Run {run_id!r} already holds {resource!r} with amount {held_amount:g}; "
                    f"a claim is taken once per resource, so amount={amount:g} is refused. "
                    "Claim a differently named resource for the extra amount."
                )
            return ClaimRow(mine[0], resource, run_id, held_amount, mine[2], False)
        marks, holding = in_list(HOLDING)
        holder = tx.fetchone(
            "SELECT c.run_id, c.claimed_at, c.amount, r.status, r.deadline FROM claims c"
            " JOIN runs r ON r.id = c.run_id"
            " WHERE c.resource = ? AND c.released_at IS NULL AND c.run_id <> ?"
            f" AND r.status IN {marks} ORDER BY c.claimed_at LIMIT 1",
            (resource, run_id, *holding),
        )
        if holder is not None:
            raise ClaimConflict(_conflict_message(resource, run_id, holder))
        claim_id = uuid.uuid4()
        now = self.now()
        amount_value = float(amount) if amount is not None else None
        tx.execute(
            "INSERT INTO claims (id, resource, run_id, amount, claimed_at) VALUES (?, ?, ?, ?, ?)",
            (claim_id, resource, run_id, amount_value, now),
        )
        self.event(
            tx,
            run_id,
            "claim_taken",
            source=source,
            detail={"resource": resource, "amount": amount_value},
        )
        return ClaimRow(claim_id, resource, run_id, amount_value, now, True)

    def claim(
        self, run_id: str, resource: str, amount: float | None = None, *, source: str = "agent"
    ) -> ClaimRow:
        """Take ``resource`` for ``run_id`` in its own transaction."""
        return self.write(lambda tx: self.claim_tx(tx, run_id, resource, amount, source=source))

    def claims(self, run_id: str | None = None, *, active: bool = False) -> list[dict[str, Any]]:
        """Claim rows, of one run or all, optionally only the unreleased ones."""
        where: list[str] = []
        params: list[Any] = []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if active:
            where.append("released_at IS NULL")
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        return self.read_dicts(
            "SELECT id, resource, run_id, amount, claimed_at, released_at, release_reason"
            f" FROM claims{clause} ORDER BY claimed_at, resource",
            params,
        )

    def last_claims_tx(self, tx: Tx, run_id: str) -> list[tuple[str, float | None]]:
        """The resources (with amounts) a run claimed, one per resource, oldest first."""
        rows = tx.fetchall(
            "SELECT resource, amount, claimed_at FROM claims WHERE run_id = ? ORDER BY claimed_at",
            (run_id,),
        )
        latest: dict[str, float | None] = {}
        for resource, amount, _ in rows:
            latest.pop(resource, None)
            latest[resource] = amount
        return list(latest.items())


def _conflict_message(resource: str, run_id: str, holder: tuple[Any, ...]) -> str:
    holder_id, since, amount, status, deadline = holder
    held = f" (amount {amount:g})" if amount is not None else ""
    text = (
        f"Resource {resource!r} is claimed by run {holder_id!r}{held} since "
        f"{moment_text(since)}; that run is {status}, so run {run_id!r} cannot "
        "claim it. "
    )
    if status == Status.SUSPENDED and deadline is not None:
        text += (
            f"It is released when run {holder_id!r} completes, is cancelled or expires "
            f"(deadline {moment_text(deadline)}): resume and finish it with "
            f"kx.resume({holder_id!r}), or wait."
        )
    else:
        text += (
            f"It is released when run {holder_id!r} completes, is cancelled or expires; "
            "wait for it, or claim another resource."
        )
    return text
