"""Journal records written by hand, for the tests that fold or replay a journal."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

__all__ = ["step_begin_record"]


def step_begin_record(run_id: str, ordinal: int, at: dt.datetime) -> dict[str, Any]:
    """The ``step_begin`` record of step ``ordinal`` of ``run_id`` (keyed by its ordinal,
    unnamed), begun ``at``; its id is the same for the same run and ordinal."""
    return {
        "id": uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{ordinal}"),
        "run_id": run_id,
        "ordinal": ordinal,
        "key": str(ordinal),
        "name": None,
        "started_at": at,
    }
