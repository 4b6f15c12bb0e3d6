"""``run.claim(resource, amount=None)``: something a run holds until it ends.

A claim is exclusive per resource string. While the holder is live or paused
(running, stopping, suspended, needs_decision), another run's claim on the same
resource fails with :class:`~kernelext.errors.ClaimConflict`, which names the
holder and since when. ``amount`` is recorded with the claim (reserved budget, a
number of slots) for the audit and for SQL queries; it does not make a resource
shareable: to share a pool, claim distinct names (``"gpu:0"``, ``"gpu:1"``).

Claiming the same resource again in the same run returns the existing claim
(resume replays the call). Claims are released, each with an event, when the run
completes, is cancelled or expires.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..._store.claims import ClaimRow

if TYPE_CHECKING:
    from .run_engine import RunEngine

__all__ = ["ClaimRow", "claim"]


def claim(run: RunEngine, resource: str, amount: float | None = None) -> ClaimRow:
    """Record that ``run`` holds ``resource``; see the module docstring."""
    if not isinstance(resource, str) or not resource.strip():
        raise ValueError(
            f"run.claim() needs a non-empty resource name such as 'customer:42', not {resource!r}."
        )
    if amount is not None:
        if (
            isinstance(amount, bool)
            or not isinstance(amount, (int, float))
            or not math.isfinite(amount)
            or amount < 0
        ):
            raise ValueError(
                f"run.claim({resource!r}, amount=...) takes a non-negative number or None, "
                f"not {amount!r}."
            )
        amount = float(amount)
    with run.force.critical():
        row = run.store.claim(run.id, resource, amount)
    if row.new:
        run.notify("claim", row)
    return row
