"""An item attempt elsewhere that answered ``ended``: settled from the item's step.

An attempt answers ``ended`` when it found the item's step no longer ``running`` (the
executor ran the item again after a worker died, or a second copy of it came) or when the
step ended while it ran. The answer's shape says nothing of how the step ended: the step
row in the store does, as the attempt that ended it recorded it. ``settle_ended`` reads it
and settles the item as that attempt would have, had its answer arrived:

- ``completed``: the value the step keeps;
- ``cancelled`` to wait for a person (``WAITS_FOR_A_PERSON``): waiting, for the approval
  or the question its step keeps open (the run suspends for it once nothing else runs);
- ``cancelled`` by a stop: that stop (a forced one when the step was ended forced);
- ``failed``: a decision the item waits for, else the item's failure with its error;
- ``abandoned``: another process took the run over from this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ForcedStop, NeedsDecision, RemoteItemError, StopRequested
from ...status import EffectStatus, Reason, StepStatus
from ..encoding.keys import load_result
from ..engine.step_info import StepInfo
from .items import Ended, note_item_done
from .view import WAITS_FOR_A_PERSON

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from .core import Batch

__all__ = ["failed_elsewhere", "item_raised", "settle_ended"]

OPEN = (EffectStatus.PENDING, EffectStatus.UNKNOWN)  # a call nobody knows the outcome of


def settle_ended(engine: RunEngine, batch: Batch, info: StepInfo, elapsed: float) -> Ended:
    """What the item ended with, as its step in the store says (``elapsed``: how long the
    attempt that answered took)."""
    rows = engine.store.read(
        "SELECT status, result, error, forced FROM steps WHERE id = ?", (info.id,)
    )
    if not rows:
        gone = RemoteItemError(f"its step {info.id} is not in the run's store")
        return item_raised(engine, batch, info, gone)
    status, result, error, forced = rows[0]
    if status == StepStatus.COMPLETED and result is not None:
        note_item_done(engine, batch, info, elapsed)
        return Ended(info.index, "done", load_result(result))
    if status == StepStatus.CANCELLED and error == WAITS_FOR_A_PERSON:
        info.waiting = _waits_for(engine, info)
        batch.item_ended(info, "waiting")
        return Ended(info.index, "waiting", info)
    if status == StepStatus.CANCELLED:
        stop = ForcedStop("forced stop") if forced else StopRequested("stop")
        return Ended(info.index, "stopped", error=stop)
    if status == StepStatus.ABANDONED:  # a take-over ends the steps left running
        lost = engine.store.ownership_lost(engine.id, engine.epoch, "item end")
        return Ended(info.index, "lost", error=lost)
    if status == StepStatus.FAILED:
        return failed_elsewhere(engine, batch, info, error)
    gone = RemoteItemError(f"its step ended {status!r} without the value it returned")
    return item_raised(engine, batch, info, gone)


def _waits_for(engine: RunEngine, info: StepInfo) -> tuple[str, Any, str]:
    """(reason, deadline, note) of the request the item's step waits for: the newest of
    its approval requests still live and its questions not answered."""
    store, run_id = engine.store, engine.id
    asks: list[tuple[Any, str, Any, str]] = [
        (row["requested_at"], Reason.APPROVAL, row["expires_at"], str(row["tool"]))
        for row in store.approval_rows(run_id=run_id)
        if row["step"] == info.key and row["consumed_at"] is None
        and row["superseded_at"] is None
    ]  # fmt: skip
    asks += [
        (row["asked_at"], Reason.INPUT, row["expires_at"], "")
        for row in store.question_rows(run_id)
        if row["step"] == info.key and row["answered_at"] is None
    ]
    if not asks:  # decided or answered meanwhile: the resume goes on from there
        return (Reason.INPUT, None, f"waiting for a person: kx.questions({run_id!r})")
    _, reason, deadline, tool = max(asks, key=lambda ask: ask[0])
    if reason == Reason.APPROVAL:
        return (reason, deadline, f"{tool} waits for approval: kx.approvals({run_id!r})")
    return (reason, deadline, f"waiting for an answer: kx.answer({run_id!r}, ...)")


def failed_elsewhere(engine: RunEngine, batch: Batch, info: StepInfo, error: Any) -> Ended:
    """An item whose step another attempt ended ``failed`` (its worker was lost before it
    answered, or a second copy of the item answered first): a call of the item waiting
    for a decision is that decision; else the item failed with ``error``, the one the step
    keeps."""
    effects = engine.store.step_effects(engine.id, info.key)
    text = str(error) if error else "the item failed"
    decided = text.startswith(f"{NeedsDecision.__name__}:")  # how _record_end keeps one
    if decided or any(row["status"] in OPEN for row in effects.values()):
        return Ended(info.index, "decision", error=NeedsDecision(text))
    gone = RemoteItemError(f"{text} (recorded by another attempt of the item)")
    return item_raised(engine, batch, info, gone)


def item_raised(engine: RunEngine, batch: Batch, info: StepInfo, error: BaseException) -> Ended:
    """The item failed with ``error`` (counted, and told to the run's listeners)."""
    batch.item_ended(info, "failed")
    engine.notify("item_failed", (info, error))
    return Ended(info.index, "raised", error=error)
