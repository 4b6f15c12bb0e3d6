"""``run.map``: a batch's items in a thread pool, up to ``concurrency`` at once.

The agent's thread dispatches: it starts items while ``Tally.may_start`` allows, looks
for a stop every ``WAIT_TICK``, and raises a forced stop into each item's thread through
the item's own ``ForceGate`` (``Batch.force_all``). How items, keys, fsyncs and stops fit
together is ``batch``'s text; an item's life is ``batch_items.ItemRun``; the async
dispatcher (``await run.amap``) is ``batch_async``.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...errors import KernelextError, StopRequested
from ..engine.forced_stop import ForceGate
from ..engine.step_info import StepInfo
from .core import MapPlan, police_overruns, prepare_map
from .items import Ended, Flight, ItemRun, Tally, look, startable
from .remote import dispatch_remote, executor_for, shut_down_message

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from .core import Batch

__all__ = ["run_map"]


def run_map(
    engine: RunEngine,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    key: Callable[[Any], Any] | None,
    concurrency: int,
    return_exceptions: bool,
    name: str | None,
    executor: Any = None,
) -> list[Any]:
    """``run.map`` (see ``Run.map``); ``executor``: see ``batch_remote``."""
    dispatch = executor_for(engine, executor) if executor is not None else None
    plan = prepare_map(
        engine,
        "run.map",
        fn,
        items,
        key=key,
        concurrency=concurrency,
        return_exceptions=return_exceptions,
        name=name,
    )
    with plan.running():
        if plan.source.may_have_todo() and dispatch is not None and not dispatch.here:
            dispatch_remote(plan, dispatch)
        elif plan.source.may_have_todo():
            _dispatch(plan, dispatch.pool if dispatch is not None else None)
    return plan.results


def _dispatch(plan: MapPlan, given: concurrent.futures.Executor | None) -> None:
    """The items in threads of this process: a pool of the batch's own, or ``given`` (a
    ``ThreadPoolExecutor`` passed as ``executor=``, left running afterwards)."""
    engine, batch = plan.engine, plan.batch
    tally = Tally(plan)
    flight = Flight()
    pool = given or concurrent.futures.ThreadPoolExecutor(
        plan.source.pool_size(plan.concurrency),
        thread_name_prefix=f"kernelext-item[{engine.id}]",
    )
    try:
        while True:
            for info in startable(tally, flight):
                context = contextvars.copy_context()
                value = plan.values[info.index]
                flight.add(_submit(pool, context, engine, batch, info, plan.fn, value))
            if not flight:
                break
            finished = look(tally, flight)
            if finished is None:  # a forced stop raised into the agent's thread
                continue
            if tally.cut_all or engine.force.wanted:
                batch.force_all()
            else:
                police_overruns(engine, batch)
            for future in finished:
                flight.discard(future)
                tally.add(future.result())
    finally:
        if given is None:
            pool.shutdown(wait=True)
        else:  # the caller's pool: wait for this batch's items only
            concurrent.futures.wait(flight.futures)
    tally.finish()


def _submit(pool: concurrent.futures.Executor, context: Any, *args: Any) -> Any:
    """Start one item in ``pool``; the caller's pool shut down meanwhile is named."""
    try:
        return pool.submit(context.run, _run_item, *args)
    except RuntimeError as exc:  # concurrent.futures: "cannot schedule new futures after ..."
        raise KernelextError(shut_down_message(type(pool).__name__)) from exc


def _run_item(
    engine: RunEngine, batch: Batch, info: StepInfo, fn: Callable[[Any], Any], item: Any
) -> Ended:
    """One item in a pool thread: begin its step, call ``fn``, store its value."""
    if engine.stop_event.is_set() or engine.suspend_request is not None or batch.forced:
        return Ended(info.index, "unstarted")  # a stop came after it was handed out
    gate = ForceGate(lambda swallowed_at: None)
    gate.thread_id = threading.get_ident()
    run = ItemRun(engine, batch, info, gate)
    try:
        try:
            run.begin()
            if engine.stop_event.is_set():  # the stop landed while the step began
                raise StopRequested(engine.stop_source or "stop")
            run.value = fn(item)
            run.finished = True
        except BaseException as exc:
            run.outcome = exc
        while True:  # absorb a forced stop that lands after the item returned
            try:
                gate.seal()
                break
            except StopRequested as late:
                if not run.finished and run.outcome is None:
                    run.outcome = late
        return run.end()
    finally:
        gate.thread_id = None
        run.leave()
