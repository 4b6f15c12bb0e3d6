"""A bare effect intent, as the ledger hands one to ``store.write_intent``, for the tests of
the store's write path (fences, take-overs, folds)."""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["bare_intent"]


def bare_intent(run_id: str, ordinal: int = 0, key: uuid.UUID | None = None) -> dict[str, Any]:
    """The intent of call ``ordinal`` of tool ``pay`` in step ``s0`` of ``run_id`` (a new
    key unless ``key`` is given)."""
    return {
        "key": key or uuid.uuid4(),
        "run_id": run_id,
        "step_key": "s0",
        "step_ordinal": 0,
        "tool": "pay",
        "call_ordinal": ordinal,
        "args_hash": "h",
        "args": "{}",
        "resumable": True,
    }
