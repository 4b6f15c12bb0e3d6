"""The step executing (``StepInfo``): the agent's open step, or one ``run.map`` item."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import StopRequested
    from .batch import Batch
    from .forced_stop import ForceGate

__all__ = ["StepInfo"]


class StepInfo:
    """The step currently executing."""

    def __init__(self, step_id: uuid.UUID, key: str, ordinal: int, name: str | None) -> None:
        self.id = step_id
        self.key = key
        self.ordinal = ordinal
        self.name = name
        self.started = time.monotonic()
        self.calls = 0
        self.overrun_reported = False
        # A ``run.map`` item (``batch``): its batch, position, own force gate, the person
        # it waits for (reason, deadline, note) and the stop raised into it.
        self.batch: Batch | None = None
        self.index = 0
        self.force: ForceGate | None = None
        self.waiting: tuple[str, Any, str | None] | None = None
        self.stop_delivered: type[StopRequested] | None = None
        self.effect_keys: list[uuid.UUID] = []  # its calls' ledger keys (``note_effect``)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
