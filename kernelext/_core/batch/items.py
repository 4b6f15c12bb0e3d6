"""One ``run.map`` / ``run.amap`` item's life, and what a batch ends with.

``ItemRun`` begins an item's step, holds what its function returned or raised, records
how it ended (``item_complete`` with the stored value, or the step ended ``cancelled``
or ``failed``) and hands the dispatcher an ``Ended``; ``Tally`` collects them and, once
no item is in flight, raises what the batch ends with (the first failure as
``kx.ItemFailed``, a stop, a forced stop, one suspension for every item waiting for a
person). The thread dispatcher (``batch_threads``) and the async one (``batch_async``)
both use them; see ``batch`` for how items, keys, fsyncs and stops fit together.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import queue
import time
import uuid
from collections.abc import Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any

from ...errors import ForcedStop, ItemFailed, NeedsDecision, OwnershipLost, StopRequested
from ...status import Reason, StepStatus
from ..encoding.canonical import Unencodable
from ..encoding.keys import stored_result
from ..encoding.secrets import scrub_text, scrubbed_excerpt
from ..engine.context import reset_current_run, set_current_run
from ..engine.groups import unwrap_group
from ..engine.step_info import ITEM, StepInfo
from .core import WAIT_TICK, Batch, MapPlan
from .view import WAITS_FOR_A_PERSON

if TYPE_CHECKING:
    from ..engine.forced_stop import ForceGate
    from ..engine.run_engine import RunEngine

__all__ = [
    "Ended",
    "Flight",
    "ItemRun",
    "Tally",
    "look",
    "new_item",
    "note_item_done",
    "startable",
]


class Ended:
    """What one item ended with."""

    __slots__ = ("error", "index", "kind", "value")

    def __init__(self, index: int, kind: str, value: Any = None, error: Any = None) -> None:
        self.index, self.kind, self.value, self.error = index, kind, value, error


class Tally:
    """What the items of one batch ended with, as its dispatcher collects them, and what
    the batch ends with once none is in flight (``finish``)."""

    def __init__(self, plan: MapPlan, *, decisions_halt: bool = True) -> None:
        self.plan = plan
        # An item waiting for a decision on an unknown effect stops new items (in this
        # process); items elsewhere go on (a worker's death leaves one such item each).
        self.decisions_halt = decisions_halt
        self.ended = 0
        self.first_failure: Ended | None = None
        self.decision: Ended | None = None
        self.lost: Ended | None = None
        self.halted = False  # an item stopped or suspended the run: start nothing more
        self.waiting: list[StepInfo] = []
        # The batch ends as a forced stop (raised once nothing is in flight): an item was
        # forced (past max_step_seconds after a stop), or the whole run was.
        self.forced: BaseException | None = None
        # The whole run was forced (raised into the dispatcher): every item in flight is
        # cut. One item forced for its own overrun cuts no other; they drain.
        self.cut_all = False

    def run_forced(self, exc: BaseException) -> None:
        """A forced stop of the run reached the dispatcher: the batch ends forced, and
        every item in flight is cut."""
        self.forced = self.forced or exc
        self.cut_all = True

    def may_start(self) -> bool:
        """Whether the dispatcher may start another item."""
        engine = self.plan.engine
        return (
            self.forced is None
            and not self.halted
            and self.first_failure is None
            and (self.decision is None or not self.decisions_halt)
            and self.lost is None
            and not engine.stop_event.is_set()
            and engine.suspend_request is None
        )

    def add(self, end: Ended) -> None:
        if end.kind == "unstarted":  # handed out as a stop landed: it never began
            return
        self.ended += 1
        if end.kind == "done":
            self.plan.results[end.index] = end.value
        elif end.kind == "raised":
            if self.plan.return_exceptions:
                self.plan.results[end.index] = end.error
            elif self.first_failure is None:
                self.first_failure = end
        elif end.kind == "waiting":
            self.waiting.append(end.value)
        elif end.kind == "decision":
            self.decision = self.decision or end
        elif end.kind == "lost":
            self.lost = self.lost or end
        elif end.kind == "stopped":
            self.halted = True
            if isinstance(end.error, ForcedStop):
                self.forced = self.forced or end.error

    def finish(self) -> None:
        """Raise what the batch ended with, once no item is in flight (nothing: done)."""
        engine, batch, keys = self.plan.engine, self.plan.batch, self.plan.keys
        if self.lost is not None:
            raise self.lost.error
        if self.forced is not None or batch.forced:
            raise self.forced if self.forced is not None else ForcedStop("forced stop")
        if self.decision is not None:
            raise self.decision.error
        if self.first_failure is not None:
            k = keys[self.first_failure.index]
            error = self.first_failure.error
            raise ItemFailed(
                f"{'run.amap' if batch.asynchronous else 'run.map'}: item {k!r} raised "
                f"{type(error).__name__}: {scrub_text(str(error))}. No new item started after "
                "it; the items in flight finished. Fix the cause and resume the run: only the "
                "items not completed run again (or pass return_exceptions=True to get the "
                "exception in the item's place).",
                key=k,
            ) from error
        if engine.suspend_request is not None:  # run.suspend(...) inside an item
            raise StopRequested(engine.suspend_request[0])
        if self.waiting:
            _suspend_for_people(engine, self.waiting)
        if self.plan.source.error is not None:  # the items' iterator or a key: after the drain
            raise self.plan.source.error
        if self.plan.source.unfinished(self.ended) or self.halted:  # a stop: the rest on resume
            engine.safe_point()
            engine._deliver(StopRequested)


def _suspend_for_people(engine: RunEngine, waiting: list[StepInfo]) -> None:
    reasons = [item.waiting for item in waiting if item.waiting is not None]
    approval = any(r[0] == Reason.APPROVAL for r in reasons)
    deadlines = [r[1] for r in reasons if r[1] is not None]
    what = "an approval" if approval else "an answer"
    count = len(waiting)
    note = (
        f"{count} item{'s' if count != 1 else ''} of the batch wait{'s' if count == 1 else ''} "
        f"for {what}: "
        + (f"kx.approvals({engine.id!r})" if approval else f"kx.questions({engine.id!r})")
    )
    engine.suspend_request = (
        Reason.APPROVAL if approval else Reason.INPUT,
        min(deadlines) if deadlines else None,
        note,
    )
    engine.stop_event.set()
    engine.stop_event.delivered = StopRequested
    raise StopRequested(engine.suspend_request[0])


def startable(tally: Tally, in_flight: Sized) -> Iterator[StepInfo]:
    """The next items a dispatcher starts now, each with its ordinal claimed: while the
    tally allows a start (no stop, failure or suspension) and fewer than ``concurrency``
    are in flight (``in_flight`` is read again before each). An iterator's items are read
    here, one at a time (``batch_source``): a stop lands at the next item it yields."""
    plan = tally.plan
    while tally.may_start() and len(in_flight) < plan.concurrency:
        try:
            index = plan.source.next_todo(tally.may_start)
        except StopRequested as exc:  # raised into the dispatching thread while it read
            tally.halted = True
            if isinstance(exc, ForcedStop):
                tally.run_forced(exc)
            return
        if index is None:
            return
        yield new_item(plan.engine, plan.batch, plan.keys[index], index)


class Flight:
    """The futures of a dispatcher's items in flight, each put on a queue as it ends:
    waiting for the next to end reads the queue, instead of installing a waiter on every
    future in flight and taking it off again (``concurrent.futures.wait``) at each look.
    An ended future is handed out by every wait until it is discarded: a look cut off by
    a forced stop after its wait loses none."""

    def __init__(self) -> None:
        self.futures: set[concurrent.futures.Future[Any]] = set()
        self._ended: queue.SimpleQueue[concurrent.futures.Future[Any]] = queue.SimpleQueue()
        self._seen: set[concurrent.futures.Future[Any]] = set()  # ended, not yet discarded

    def add(self, future: concurrent.futures.Future[Any]) -> None:
        self.futures.add(future)
        future.add_done_callback(self._ended.put)  # at once when it has ended already

    def discard(self, future: concurrent.futures.Future[Any]) -> None:
        self.futures.discard(future)
        self._seen.discard(future)

    def __len__(self) -> int:
        return len(self.futures)

    def wait(self, timeout: float) -> set[concurrent.futures.Future[Any]]:
        """The futures that ended and are not discarded; waits up to ``timeout`` for one."""
        if not self._seen:
            try:
                self._seen.add(self._ended.get(timeout=timeout))
            except queue.Empty:
                return set()
        while True:
            try:
                self._seen.add(self._ended.get_nowait())
            except queue.Empty:
                return set(self._seen)


def look(
    tally: Tally, flight: Flight | Iterable[concurrent.futures.Future[Any]]
) -> set[Any] | None:
    """Wait one tick for items in flight to end, then look for a stop another process
    recorded; the futures that ended. None: a forced stop was raised into the
    dispatching thread meanwhile (noted on the tally)."""
    engine = tally.plan.engine
    try:
        if isinstance(flight, Flight):
            finished = flight.wait(WAIT_TICK)
        else:
            finished, _ = concurrent.futures.wait(
                flight, timeout=WAIT_TICK, return_when=concurrent.futures.FIRST_COMPLETED
            )
        if not engine.stop_event.is_set():
            engine.poll_external_stop()
    except ForcedStop as exc:
        tally.run_forced(exc)
        return None
    return finished


def note_item_done(engine: RunEngine, batch: Batch, info: StepInfo, elapsed: float) -> None:
    """What this process keeps of an item that completed (its value is in the store)."""
    engine.completed[info.key] = info.ordinal
    batch.item_ended(info, "done", elapsed)
    engine.last_completed = info
    engine.notify(StepStatus.COMPLETED, info)


def new_item(engine: RunEngine, batch: Batch, key: str, index: int) -> StepInfo:
    ordinal = engine.claim_ordinal(key)
    assert ordinal is not None  # only items not completed are started
    info = StepInfo(uuid.uuid4(), key, ordinal, batch.name)
    info.batch = batch
    info.index = index
    return info


class ItemRun:
    """One item from its start to what it ended with, in the thread or the task that runs
    it: made there (the item is this thread's or task's ``ITEM`` until ``leave``), then
    ``begin``, the item's function (its value in ``value`` and ``finished``, or what it
    raised in ``outcome``), ``end`` (recorded), ``leave``."""

    def __init__(self, engine: RunEngine, batch: Batch, info: StepInfo, gate: ForceGate) -> None:
        self.engine, self.batch, self.info = engine, batch, info
        info.force = gate
        info.started = time.monotonic()
        self._item_token = ITEM.set(info)
        self._run_token = set_current_run(engine)
        with batch.lock:
            batch.in_flight[info.key] = info
        self.begun = self.finished = False
        self.value: Any = None
        self.outcome: BaseException | None = None

    def begin(self) -> None:
        """The item's step begins (journaled; no forced stop lands in it)."""
        engine, info = self.engine, self.info
        assert info.force is not None
        with info.force.critical():
            engine.store.begin_step(engine.id, info.id, info.ordinal, info.key, info.name)
            self.begun = True
        engine.notify("step", info)

    def end(self) -> Ended:
        """Record how the item ended: its value stored, or its step ended."""
        return _record_end(
            self.engine, self.batch, self.info, self.begun, self.finished, self.value, self.outcome
        )

    def leave(self) -> None:
        self.batch.item_ended(self.info)  # a stopped or lost one (the others have left)
        reset_current_run(self._run_token)
        ITEM.reset(self._item_token)


def _record_end(
    engine: RunEngine,
    batch: Batch,
    info: StepInfo,
    begun: bool,
    finished: bool,
    value: Any,
    outcome: BaseException | None,
) -> Ended:
    index = info.index
    store = engine.store
    if outcome is not None:  # a stop raised inside the item's task group is that stop
        outcome = unwrap_group(outcome)
    try:
        if finished and inspect.isawaitable(value):  # run.map with a fn that returns one
            close = getattr(value, "close", None)
            if callable(close):
                close()  # never awaited: nothing of it ran
            finished, outcome = (
                False,
                TypeError(
                    f"item {info.key!r} returned a {type(value).__name__} that nothing awaits: in "
                    "an async def agent, await run.amap(fn, items); in a plain def agent, give "
                    "run.map a plain function"
                ),
            )
        if finished:
            try:
                encoded = stored_result(value)
            except (Unencodable, TypeError, ValueError) as exc:
                outcome = TypeError(
                    f"the value item {info.key!r} returned, a {type(value).__name__}, cannot be "
                    f"stored ({exc}); return plain values (dict, list, str, numbers, datetime, "
                    "Decimal, bytes, tuples, sets)"
                )
            else:
                store.complete_item(engine.id, info.id, info.elapsed, encoded)
                engine.forget_item_effects(info)  # a completed item is never consulted again
                note_item_done(engine, batch, info, info.elapsed)
                return Ended(index, "done", value)
        assert outcome is not None
        if isinstance(outcome, OwnershipLost):
            return Ended(index, "lost", error=outcome)
        if isinstance(outcome, StopRequested):
            forced = isinstance(outcome, ForcedStop)
            if begun:
                why = (
                    "forced stop" if forced else (WAITS_FOR_A_PERSON if info.waiting else "stopped")
                )
                store.end_step(
                    engine.id, info.id, StepStatus.CANCELLED, error=why, forced=forced,
                    duration_s=info.elapsed,
                )  # fmt: skip
            if info.waiting is not None:
                batch.item_ended(info, "waiting")
                return Ended(index, "waiting", info)
            return Ended(index, "stopped", error=outcome)
        text = scrub_text(f"{type(outcome).__name__}: {outcome}")
        if begun:
            store.end_step(
                engine.id, info.id, StepStatus.FAILED, error=scrubbed_excerpt(text, 2000),
                duration_s=info.elapsed,
            )  # fmt: skip
        if isinstance(outcome, NeedsDecision):
            return Ended(index, "decision", error=outcome)
        batch.item_ended(info, "raised")
        engine.notify("item_failed", (info, outcome))
        return Ended(index, "raised", error=outcome)
    except OwnershipLost as exc:
        return Ended(index, "lost", error=exc)
