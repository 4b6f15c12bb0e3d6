"""``await run.amap(fn, items, ...)``: a batch's items as tasks on the agent's event loop.

The same batch as ``run.map`` (``batch``: items are steps keyed up front, values stored
when an item completes, a stop drains, the first failure raises ``kx.ItemFailed``, items
waiting for a person suspend the run once), with an ``async def fn`` and one task per
item, up to ``concurrency`` at once. The checks and the keys are made when ``run.amap``
is called, before it returns its coroutine: bad arguments are refused before any item
runs, and nothing needs awaiting.

- **Only in an async agent.** ``run.amap`` runs on the event loop that kernelext runs an
  ``async def`` agent on (``worker``); called elsewhere (a plain ``def`` agent, a loop of
  the agent's own), it says to use ``run.map``.
- **Each item is a task** that sets ``step_info.ITEM`` itself (a task runs in a copy of the
  context it was made in, so the item is that task's and the tasks it makes'); its effects
  are keyed under its step and a sync or async ``@kx.effect`` records as anywhere (a sync
  one blocks the loop while it runs: prefer ``async def`` effects in items).
- **Durability is shared.** An item's durable writes (its effects' intents, its
  completion) wait in the batch's threads (``Batch.executor``, one per item in flight)
  while the loop runs the other items, so writes made at once share one fsync, as the
  threads of ``run.map`` do.
- **Stops.** The dispatcher (the agent's task) starts no item once a stop is asked and
  looks for one every ``WAIT_TICK`` while items run. A forced stop cancels every item's
  task through the item's ``ForceGate`` (``forced_stop``, invariant 7): the
  ``CancelledError`` lands in the item's awaited call (an effect in flight: ``unknown``)
  and the item ends as a forced stop; the run suspends forced, as a sync forced stop does.
  ``max_step_seconds`` bounds each item as in ``run.map`` (``police_overruns``, every
  tick): past it an item is reported, and after a stop its task alone is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from ...errors import ForcedStop, KernelextError
from ..engine.forced_stop import ForceGate
from .core import WAIT_TICK, MapPlan, police_overruns, prepare_map
from .items import Ended, ItemRun, Tally, startable

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from ..engine.step_info import StepInfo
    from .core import Batch

__all__ = ["run_amap"]


def run_amap(
    engine: RunEngine,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    key: Callable[[Any], Any] | None,
    concurrency: int,
    return_exceptions: bool,
    name: str | None,
) -> Coroutine[Any, Any, list[Any]]:
    """``run.amap`` (see ``Run.amap``): checked and keyed now, its items run when awaited."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop is not engine.loop:
        raise KernelextError(
            "run.amap is awaited inside an async def agent (results = await run.amap(fn, "
            "items)); this run's agent "
            + (
                "is a plain def: call run.map(fn, items) instead (a plain fn; its items run "
                "in threads), or make the agent async def."
                if engine.loop is None
                else "runs its own event loop here: await run.amap on the agent's loop (in "
                "the async def agent itself, not inside asyncio.run or another thread's loop)."
            )
        )
    plan = prepare_map(
        engine,
        "run.amap",
        fn,
        items,
        key=key,
        concurrency=concurrency,
        return_exceptions=return_exceptions,
        name=name,
    )
    return _amap(plan)


async def _amap(plan: MapPlan) -> list[Any]:
    with plan.running():
        if plan.source.may_have_todo():
            # Items' durable writes (an intent, an item's completion) wait in these
            # threads, one per item in flight: writes made at once share one fsync.
            plan.batch.executor = executor = concurrent.futures.ThreadPoolExecutor(
                plan.source.pool_size(plan.concurrency),
                thread_name_prefix=f"kernelext-durable[{plan.engine.id}]",
            )
            try:
                await _dispatch(plan)
            finally:
                plan.batch.executor = None
                executor.shutdown(wait=False)  # every item ended: none is running
    return plan.results


async def _dispatch(plan: MapPlan) -> None:
    engine, batch = plan.engine, plan.batch
    tally = Tally(plan)
    flight: dict[asyncio.Future[Ended], int] = {}  # the item tasks, and their items
    while True:
        for info in startable(tally, flight):
            item = _run_item(engine, batch, info, plan.fn, plan.values[info.index])
            flight[asyncio.ensure_future(item)] = info.index
        if not flight:
            break
        try:
            finished, _ = await asyncio.wait(
                flight, timeout=WAIT_TICK, return_when=asyncio.FIRST_COMPLETED
            )
            if not engine.stop_event.is_set():
                engine.poll_external_stop()
        except asyncio.CancelledError as exc:  # the agent's task: cancel the items too
            _uncancel()
            tally.run_forced(_as_forced(exc, engine.force))
            batch.force_all()
            continue
        if tally.cut_all or engine.force.wanted:
            batch.force_all()
        else:
            police_overruns(engine, batch)
        for done in finished:
            index = flight.pop(done)
            if done.cancelled():  # cancelled from outside kernelext: as a forced stop
                tally.add(Ended(index, "stopped", error=ForcedStop("item task cancelled")))
            else:
                tally.add(done.result())
    tally.finish()


async def _run_item(
    engine: RunEngine, batch: Batch, info: StepInfo, fn: Callable[[Any], Any], item: Any
) -> Ended:
    """One item as a task: begin its step, await ``fn(item)``, store its value."""
    gate = ForceGate(lambda swallowed_at: None)
    task = asyncio.current_task()
    assert task is not None
    gate.attach_task(task)
    run = ItemRun(engine, batch, info, gate)
    try:
        try:
            run.begin()
            run.value = await _awaitable(fn(item), info.key)
            run.finished = True
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                _uncancel()
            run.outcome = _as_forced(exc, gate)
        gate.seal()  # a task's gate: withdraws a cancel still queued, raises nothing
        # Recorded in a thread: items completing at once share one fsync (group commit)
        # while the loop runs the others. Shielded: the item's end is always recorded.
        ending = asyncio.get_running_loop().run_in_executor(batch.executor, run.end)
        return await asyncio.shield(ending)
    finally:
        run.leave()


def _awaitable(out: Any, key: str) -> Awaitable[Any]:
    """What ``fn(item)`` returned, to await: ``run.amap`` takes an ``async def fn`` (or a
    lambda that returns a coroutine)."""
    if inspect.isawaitable(out):
        return out
    raise TypeError(
        f"run.amap(fn=...) returned an object of type {type(out).__name__} for item {key!r}, "
        "not a coroutine to await: run.amap takes an async def fn (or a lambda returning a "
        "coroutine); for a plain function call run.map(fn, items), whose items run in threads."
    )


def _as_forced(exc: BaseException, gate: ForceGate) -> BaseException:
    """The ``CancelledError`` of a forced stop is that ``ForcedStop`` (the item or run
    ends as forced, its in-flight call ``unknown``); anything else is itself."""
    if isinstance(exc, asyncio.CancelledError) and gate.raised:
        forced = ForcedStop("forced stop")
        forced.__cause__ = exc
        return forced
    return exc


def _uncancel() -> None:
    """The current task took its cancellation in: no longer being cancelled (3.11+)."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        with contextlib.suppress(Exception):
            uncancel()
