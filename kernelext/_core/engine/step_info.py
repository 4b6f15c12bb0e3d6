"""The step executing (``StepInfo``): the agent's open step, or one ``run.map`` item.

The item a thread (or asyncio task) executes is ``ITEM``, read by ``current_item``; the
batch it belongs to is seen here as a ``RunningBatch``, what the engine and the views read
of a ``run.map`` in progress (``batch.Batch`` is the one kind).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
import uuid
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...errors import StopRequested
    from .forced_stop import ForceGate

__all__ = ["ITEM", "RunningBatch", "StepInfo", "current_item"]


class RunningBatch(Protocol):
    """A ``run.map`` in progress as the engine, its items and the views read it."""

    @property
    def engine(self) -> object: ...  # the run's engine (``RunEngine``)

    @property
    def name(self) -> str | None: ...

    @property
    def failed(self) -> int: ...  # items that failed so far

    @property
    def executor(self) -> concurrent.futures.Executor | None: ...  # run.amap's write threads

    def snapshot(self) -> dict[str, Any]: ...  # the counts, read under the batch's lock


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
        self.batch: RunningBatch | None = None
        self.index = 0
        self.force: ForceGate | None = None
        self.waiting: tuple[str, Any, str | None] | None = None
        self.stop_delivered: type[StopRequested] | None = None
        self.effect_keys: list[uuid.UUID] = []  # its calls' ledger keys (``note_effect``)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


# The item the current thread (or asyncio task) executes, if any.
ITEM: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "kernelext_item", default=None
)


def current_item(engine: object) -> StepInfo | None:
    """The ``run.map`` item of ``engine`` this thread (or task) executes, else None."""
    item = ITEM.get()
    if item is not None and item.batch is not None and item.batch.engine is engine:
        return item
    return None
