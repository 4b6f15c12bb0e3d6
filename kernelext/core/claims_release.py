"""Releasing a run's claims when it ends (completed, cancelled, expired)."""

from __future__ import annotations

from typing import Any

from ..store import Store

__all__ = ["release_claims_tx"]


def release_claims_tx(store: Store, tx: Any, run_id: str, why: str) -> int:
    rows = tx.fetchall(
        "UPDATE claims SET released_at = ?, release_reason = ? WHERE run_id = ?"
        " AND released_at IS NULL RETURNING resource, amount",
        (store.now(), why, run_id),
    )
    for resource, amount in rows:
        store.event(
            tx,
            run_id,
            "claim_released",
            source="engine",
            reason=why,
            detail={"resource": resource, "amount": amount},
        )
    return len(rows)
