"""``run.map`` / ``run.amap``: a batch of items, each one step of the run, up to
``concurrency`` at once.

This module is the batch's core, shared by its two dispatchers: ``batch_threads``
(``run.map``: a plain ``fn``, items in a thread pool) and ``batch_async``
(``await run.amap``: an ``async def fn``, items as tasks on the agent's event loop). Both
check and key the items here (``prepare_map``), and begin and end each item and collect
what the items ended with through ``batch_items`` (``ItemRun``, ``Tally``).

How items, keys, fsyncs and stops fit together:

1. **Keys never depend on scheduling.** Every item's step key is ``key(item)`` (default:
   its position), computed for all items of a list before any runs (duplicates are refused
   then), and for an iterator as its items are read (``batch_source``).
   An effect called inside an item is keyed under the item's step with the call ordinal
   counted within the item (``RunEngine.next_call`` reads the item from a context
   variable, ``step_info.ITEM``), so which item finished first changes no key.
2. **An item is one step.** It begins (journaled), runs ``fn(item)``, and completes with
   its return value stored (``item_complete``, the encoding effect results use); a resume
   returns stored values and runs only what did not complete. Items never snapshot
   ``run.state`` (the agent writes it, with the list ``run.map`` returns).
3. **Durability is shared.** Items completing at once append their records to the
   journal and share one ``fdatasync`` (the journal's group commit); ``run.amap``'s tasks
   wait for their durable writes in threads of the batch's own for the same reason.
4. **Stops drain.** The dispatcher (the agent's thread, or the agent's task) starts no
   item once a stop is asked, an item failed, or an item suspended the run; items in
   flight run to their step's end. A forced stop (or an item past ``max_step_seconds``
   after a stop) goes through each item's own ``ForceGate``: raised into an item's thread,
   or cancelling an item's task; a call cut short is ``unknown``. An item waiting for a
   person ends without holding up the others; the run suspends once nothing else can
   run, with every open request listed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..._formatting import duration_text, step_label
from ..._shown import shows
from ..._validate import check_callable
from ..._validate_functions import is_async_function
from ...errors import (
    KernelextError,
    StateNotWritable,
)
from ..engine.step_info import StepInfo, current_item
from .source import ItemSource
from .view import BATCH_STARTED, drain_line

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine

__all__ = ["Batch", "ItemState", "MapPlan", "prepare_map"]

ItemCount = Literal["done", "raised", "waiting"]  # what an item that ended is counted as
WAIT_TICK = 0.05  # how often the dispatching thread looks for a stop while items run
FORCE_RETRY = 0.01  # a forced stop refused inside kernelext's bookkeeping: tried again


class ItemState(Mapping[str, Any]):
    """``run.state`` as an item sees it: readable, never written (items run at once, so
    what one wrote would depend on which finished first; a resume would not restore it)."""

    def __init__(self, state: dict[str, Any], key: str) -> None:
        self._state = state
        self._key = key

    def __getitem__(self, name: str) -> Any:
        return self._state[name]

    def __iter__(self) -> Any:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    @shows
    def __repr__(self) -> str:
        return f"<run.state, read-only inside item {self._key!r}: {self._state!r}>"

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise refused_state_write(self._key)

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse


def refused_state_write(key: str) -> StateNotWritable:
    return StateNotWritable(
        f"run.state is not written from inside a run.map item (item {key!r}): items run at "
        "once, so what they wrote would depend on which finished first, and a resume would "
        "not restore it. Return the value from the item instead: run.map (and run.amap) "
        "returns the values in input order, and the agent writes run.state "
        "(run.state['ids'] = run.map(...))."
    )


class Batch:
    """One ``run.map`` call in progress: its items in flight and what they ended with."""

    def __init__(
        self, engine: RunEngine, name: str | None, total: int, *, asynchronous: bool = False
    ) -> None:
        self.engine = engine
        self.name = name
        self.asynchronous = asynchronous  # run.amap: items are tasks
        # run.amap: the threads its items' durable writes wait in (batch_async)
        self.executor: concurrent.futures.Executor | None = None
        self.total = total  # of an iterator: the items read so far
        self.reading = False  # an iterator's items are still being read (more may come)
        self.done = 0
        self.done_before = 0  # items completed before this call (a resume): their stored values
        self.failed = 0
        self.waiting = 0
        self.in_flight: dict[str, StepInfo] = {}
        self.started = time.monotonic()
        self.durations: collections.deque[float] = collections.deque(maxlen=64)
        self.lock = threading.Lock()
        self.forced = False

    def snapshot(self) -> dict[str, Any]:
        """Counts for the panel and ``h.status_text`` (any thread)."""
        with self.lock:
            flight = list(self.in_flight.values())
            durations = list(self.durations)
        typical = sorted(durations)[len(durations) // 2] if durations else None
        longest_left = None
        if flight and typical is not None:
            longest_left = max(max(typical - item.elapsed, 0.0) for item in flight)
        return {
            "total": self.total,
            "reading": self.reading,
            "done": self.done,
            "raised": self.failed,
            "waiting": self.waiting,
            "in_flight": len(flight),
            "elapsed": time.monotonic() - self.started,
            "typical_item_s": typical,
            "drain_s": longest_left,
        }

    def force_all(self) -> None:
        """Raise ``ForcedStop`` into every item in flight (each once; refused while an
        item is inside kernelext's bookkeeping, so tried again until each landed or
        ended)."""
        self.forced = True
        for info in self.flight():
            force_item(self.engine, info, "forced stop")

    def flight(self) -> list[StepInfo]:
        with self.lock:
            return list(self.in_flight.values())

    def item_ended(
        self, info: StepInfo, counted: ItemCount | None = None, elapsed: float = 0.0
    ) -> None:
        """``info`` leaves the items in flight and is ``counted`` (``done``, ``failed``,
        ``waiting``; None: a stopped or lost item, counted by none) in the same instant, so
        that no reader of the counts (the panel, ``h.status_text``, ``kernelext show``)
        sees an item both in flight and ended."""
        with self.lock:
            self.in_flight.pop(info.key, None)
            if counted == "done":
                self.done += 1
                self.durations.append(elapsed)
            elif counted == "raised":
                self.failed += 1
            elif counted == "waiting":
                self.waiting += 1


class MapPlan:
    """One ``run.map`` / ``run.amap`` call, checked (and, for a collection, keyed) before
    any item runs; an iterator's items are read and keyed as they run (``batch_source``)."""

    def __init__(
        self,
        engine: RunEngine,
        fn: Callable[[Any], Any],
        source: ItemSource,
        concurrency: int,
        return_exceptions: bool,
        *,
        batch: Batch,
    ) -> None:
        self.engine = engine
        self.fn = fn
        self.source = source
        # the source's own lists, which grow as an iterator's items are read
        self.values, self.keys, self.results = source.values, source.keys, source.results
        self.concurrency = concurrency
        self.return_exceptions = return_exceptions
        self.batch = batch

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The batch is the run's ``engine.batch`` (the panel's) while its items run."""
        engine = self.engine
        engine.batch = self.batch
        engine.notify("batch", self.batch)
        try:
            yield
            if self.source.lazy and self.source.exhausted:  # now the batch's size is known
                count_total(engine, self.keys)
        finally:
            engine.batch = None
            engine.notify("batch_end", self.batch)


def prepare_map(
    engine: RunEngine,
    where: str,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    key: Callable[[Any], Any] | None,
    concurrency: int,
    return_exceptions: bool,
    name: str | None,
) -> MapPlan:
    """Check a batch's arguments, refusing before any item runs; key a collection's items
    and load the values of items completed before (a resume), an iterator's as they are
    read (``batch_source``); honour a stop asked before the batch. ``where``: ``run.map``
    or ``run.amap``."""
    asynchronous = where == "run.amap"
    check_callable(f"{where}(fn=...)", fn, what="the function to call for each item")
    if not asynchronous and is_async_function(fn):
        raise TypeError(
            f"run.map(fn=...) got the async def {getattr(fn, '__name__', fn)!r}, whose items "
            "would be coroutines never awaited: in an async def agent, await run.amap(fn, "
            "items); in a plain def agent, make fn a plain def. Nothing ran."
        )
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"{where}(fn=...) stores what fn returns, but {getattr(fn, '__name__', fn)!r} is "
            "a generator function: each call would return a generator that never runs and "
            "cannot be stored. Return a list instead (return list(...)). Nothing ran."
        )
    if key is not None:
        check_callable(f"{where}(key=...)", key, what="a function that gives each item's key")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(
            f"{where}(concurrency=...) takes a whole number of items to run at once (>= 1), "
            f"not {type(concurrency).__name__} {concurrency!r}."
        )
    if concurrency < 1:
        raise ValueError(
            f"{where}(concurrency={concurrency}) would run no item: give a whole number >= 1 "
            "(1 runs the items one at a time)."
        )
    if not isinstance(return_exceptions, bool):
        raise TypeError(
            f"{where}(return_exceptions=...) takes True or False, not {return_exceptions!r}."
        )
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"{where}(items=...) takes the items to go through (a list, a generator...), not "
            f"{type(items).__name__}."
        )
    if current_item(engine) is not None:
        raise KernelextError(
            f"{where} cannot be called inside a run.map item: items are steps, and steps do "
            f"not nest. Call {where} from the agent, or make the inner work part of the item."
        )
    _check_no_open_step(engine, where)
    batch = Batch(engine, name, 0, asynchronous=asynchronous)
    source = ItemSource(engine, where, items, key, batch)
    batch.reading = source.lazy
    if not source.lazy:
        source.read_all()  # every key checked, and stored values loaded, before any item runs
    engine.safe_point()  # a stop asked before the batch starts no item
    plan = MapPlan(engine, fn, source, concurrency, return_exceptions, batch=batch)
    if not source.lazy:
        count_total(engine, plan.keys)
    _record_start(engine, batch, source.lazy)
    return plan


def _check_no_open_step(engine: RunEngine, where: str) -> None:
    """No batch while a step is open (inside ``with run.step(...)`` or a ``run.steps``
    loop): items are steps, and steps do not nest. (Completing the open step first would
    mark it done before its items ran: a resume would skip them.)"""
    info = engine._current
    if info is not None:
        raise KernelextError(
            f"{where} cannot be called inside step {info.key!r} (a with run.step(...) block "
            "or a for loop over run.steps(...)): items are steps, and steps do not nest; a "
            "resume would skip the step, and with it the items not done. Nothing ran. Call "
            f"{where} from the agent outside the block or loop, with keys unique across the "
            "run (key=lambda item: f'{chunk}/{item}' for one batch per chunk), and write "
            "run.state from what it returns."
        )


def force_item(engine: RunEngine, info: StepInfo, why: str) -> None:
    """Raise ``ForcedStop`` into one item in flight (once; refused inside kernelext's
    bookkeeping, then tried again at the next tick), and record it."""
    gate = info.force
    at = engine.store.now()  # before the raise: the item's end is dated after it
    if gate is not None and gate.try_raise():
        engine.store.record_event(
            engine.id,
            "force_raised",
            wait=False,
            at=at,
            source="engine",
            reason=f"{step_label(info.ordinal, info.key)} cancelled after "
            f"{duration_text(info.elapsed)} ({why})",
        )


def police_overruns(engine: RunEngine, batch: Batch) -> None:
    """``max_step_seconds`` bounds each item: an item past it is reported once; after a
    stop it is forced (the others drain), so a stop never waits for a hung item."""
    limit = engine.max_step_seconds
    if not limit:
        return
    stopping = engine.stop_event.is_set()
    for info in batch.flight():
        if info.elapsed <= limit:
            continue
        if stopping:
            force_item(engine, info, overran_text(info, limit))
        elif not info.overrun_reported:
            info.overrun_reported = True
            engine.store.record_event(
                engine.id, "step_overran", wait=False, reason=overran_text(info, limit)
            )


def _record_start(engine: RunEngine, batch: Batch, lazy: bool) -> None:
    """The ``batch_started`` event (queued, never waited for): its name, size (None: an
    iterator, read as its items run) and items done before, which ``kernelext show`` and
    ``kx.plan`` read in any process."""
    items = None if lazy else batch.total
    detail = {"name": batch.name, "items": items, "done": batch.done_before}
    with contextlib.suppress(Exception):  # a store hiccup must not hold the batch back
        engine.store.record_event(
            engine.id, BATCH_STARTED, wait=False, source="engine", detail=detail
        )


def count_total(engine: RunEngine, keys: list[str]) -> None:
    """The run's total of steps, once a batch's keys are all known."""
    if engine.total_steps is not None:
        return
    mine = set(keys)
    before = sum(1 for k in engine.completed if k not in mine)
    engine.total_steps = total = before + len(keys)
    engine.store.write_async(
        lambda tx: engine.store.update_run_tx(tx, engine.id, total_steps=total)
    )
    engine.notify("total", total)


def drain_text(batch: Batch) -> str:
    """``stopping: 12 items in flight, about 3 s`` (the drain of a stopped batch)."""
    counts = batch.snapshot()
    return drain_line(counts["in_flight"], counts["drain_s"])


def overran_text(info: StepInfo, limit: float) -> str:
    return f"{step_label(info.ordinal, info.key)} passed max_step_seconds ({duration_text(limit)})"
