"""``run.map(fn, items, executor=ex)``: a batch's items in other processes.

Who owns what when items run elsewhere:

- **The run stays the owner's** (the notebook's process). It keys every item, begins each
  item's step (durable before the item is dispatched: the worker completes that step
  attempt, never another), dispatches at most ``concurrency`` items, gathers their values
  in input order, and moves the run's status. A stop dispatches nothing more; a forced
  stop cancels the futures in flight (their steps end ``cancelled``).
- **An item attempt is the worker's** (``remote_item.execute_item``): it opens the store
  from the run's URL (PostgreSQL; the worker's own credentials), records the item's
  effects under the keys an item in the owner's process would use (run, item step key,
  tool, call ordinal within the item), and writes the item's completion.
- **The epoch fences them.** Each task carries the epoch the owner holds; every write of
  the worker carries it, so once another process took the run over (a resume after the
  notebook died) a stale owner's worker is refused.
- **The executor may run an attempt again** (Dask, when a worker died): applied effects
  are replayed from the ledger, an intent without an outcome becomes ``unknown`` and the
  item waits for a decision; the other items go on, and the run ends ``needs_decision``
  once nothing else can run. A future the executor gave up on (``KilledWorker``, a
  broken process pool) whose step is still ``running`` is a lost item: its step ends
  ``failed``, ``run.map`` raises ``kx.ItemFailed`` naming its key, and a resume runs it
  again; when an attempt had ended the step before its worker died (the item completed,
  its answer did not arrive), the step's row settles the item, as for ``ended`` below.
  An attempt that found the item's step ended already answers ``ended``: the step's row
  says what the item ended with (its value, waiting for a person, a stop, a failure;
  ``remote_ended``), never the answer.

A ``ThreadPoolExecutor`` runs the items in this process, as without ``executor=``.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

from ...errors import (
    ForcedStop,
    KernelextError,
    OwnershipLost,
    RemoteItemError,
)
from ...status import StepStatus
from ..encoding.keys import load_result
from ..encoding.secrets import scrub_text, scrubbed_excerpt
from ..engine.step_info import StepInfo
from .core import MapPlan, police_overruns
from .items import Ended, Tally, look, note_item_done, startable
from .remote_ended import item_raised, settle_ended
from .remote_item import WorkerCall
from .wire import (
    RemoteTask,
    dumps,
    error_from_wire,
    loads,
    pack,
)

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from .core import Batch

__all__ = ["ITEMS_DISPATCHED", "Dispatch", "dispatch_remote", "executor_for"]

ITEMS_DISPATCHED = "items_dispatched"  # run.map(executor=...) sent items to other processes

Future = concurrent.futures.Future
WORKER = WorkerCall()


class Dispatch:
    """Where ``run.map(executor=...)`` sends its items: the executor (a Dask ``Client``
    becomes its ``get_executor()``), whether that is this process, and its name."""

    def __init__(self, pool: concurrent.futures.Executor, here: bool, label: str) -> None:
        self.pool, self.here, self.label = pool, here, label


def executor_for(engine: RunEngine, executor: Any) -> Dispatch:
    """Check ``executor=`` before anything runs: its kind, and for one that runs items in
    other processes, a store that they can write (PostgreSQL) and an epoch to fence with."""
    label = type(executor).__name__
    if _is_dask_client(executor):
        pool, here = executor.get_executor(pure=False), False
        label = "a distributed.Client"
    elif isinstance(executor, concurrent.futures.ThreadPoolExecutor):
        refuse_shut_down(executor, label)
        return Dispatch(executor, True, label)
    elif isinstance(executor, concurrent.futures.Executor):
        pool, here = executor, False
    else:
        raise TypeError(
            "run.map(executor=...) takes a concurrent.futures.Executor (ThreadPoolExecutor, "
            "ProcessPoolExecutor, a Dask client's get_executor()) or a distributed.Client, "
            f"not {label}. Nothing ran."
        )
    refuse_shut_down(pool, label)
    if getattr(engine.store.backend, "dialect", None) != "postgres":
        raise KernelextError(
            f"run.map(executor={label}) runs items in other processes, and each records its "
            f"effects in the run's store itself; run {engine.id!r} is in the DuckDB store "
            f"{engine.store.location}, which one process at a time can write. Nothing was "
            "dispatched. Use a PostgreSQL store for batches on other processes or machines "
            "(kx.configure(store='postgresql://host/db'), or KERNELEXT_STORE; docs/batches.md: "
            "Beyond one machine), or leave out executor= to run the items in threads here."
        )
    if engine.epoch is None:
        raise KernelextError(
            f"Run {engine.id!r} holds no ownership epoch in this process, so its workers' "
            "writes could not be fenced; nothing was dispatched. Resume the run here first."
        )
    return Dispatch(pool, here, label)


# Set by ``shutdown()``: ThreadPoolExecutor and a Dask client's executor (``_shutdown``),
# ProcessPoolExecutor (``_shutdown_thread``).
_SHUT_DOWN_FLAGS = ("_shutdown", "_shutdown_thread")


def refuse_shut_down(pool: concurrent.futures.Executor, label: str) -> None:
    """Refuse an executor that was shut down, before anything is dispatched (its
    ``submit`` would raise a bare ``RuntimeError`` in the middle of the batch)."""
    if any(getattr(pool, flag, False) is True for flag in _SHUT_DOWN_FLAGS):
        raise KernelextError(shut_down_message(label) + " Nothing was dispatched.")


def shut_down_message(label: str) -> str:
    return (
        f"run.map(executor={label}): the executor was shut down (ex.shutdown() was called, "
        "or the `with` block that made it ended), so it takes no more work. Pass an "
        "executor that is still open (create it again, e.g. "
        "concurrent.futures.ProcessPoolExecutor(), or client.get_executor() of a connected "
        "Dask client), or leave out executor= to run the items in threads here."
    )


def _is_dask_client(executor: Any) -> bool:
    kind = type(executor)
    return (
        kind.__module__.split(".")[0] == "distributed"
        and kind.__name__ == "Client"
        and callable(getattr(executor, "get_executor", None))
    )


def dispatch_remote(plan: MapPlan, dispatch: Dispatch) -> None:
    """Run the plan's items through ``dispatch`` (other processes); raise what the batch
    ended with (``Tally.finish``)."""
    engine, batch = plan.engine, plan.batch
    fn_blob = pack(plan.fn, f"fn ({getattr(plan.fn, '__name__', plan.fn)!r})", dispatch.label)
    tally = Tally(plan, decisions_halt=False)
    todo = plan.source.read_all(tally.may_start)  # an iterator: read whole (a stop ends it)
    blobs = {
        index: pack(plan.values[index], f"item {plan.keys[index]!r}", dispatch.label)
        for index in todo
    }  # every item checked before the first is dispatched
    base = _task_fields(engine)
    # Durable before the first dispatch: a take-over of this run knows that workers may
    # outlive this process inside their calls (takeover.workers_maybe_in_calls).
    engine.store.record_event(
        engine.id, ITEMS_DISPATCHED, source="engine", detail={"executor": dispatch.label}
    )
    flight: dict[Future[bytes], StepInfo] = {}
    try:
        while True:
            for info in startable(tally, flight):
                engine.store.begin_step(
                    engine.id, info.id, info.ordinal, info.key, info.name, wait=True
                )
                info.started = time.monotonic()
                with batch.lock:
                    batch.in_flight[info.key] = info
                engine.notify("step", info)
                task = RemoteTask(
                    **base,
                    step_id=info.id,
                    key=info.key,
                    ordinal=info.ordinal,
                    name=info.name,
                    fn_blob=fn_blob,
                    item_blob=blobs.pop(info.index),
                )
                flight[_submit(engine, dispatch, info, task)] = info
            if not flight:
                break
            finished = look(tally, flight) or set()  # (None: a forced stop, below)
            if tally.cut_all or engine.force.wanted:
                batch.forced = True
                finished = set(flight)  # every item in flight is cancelled now
                for future in finished:
                    future.cancel()
            else:
                police_overruns(engine, batch)
                finished |= _overrun_after_stop(engine, flight)
            done_before = batch.done
            for future in finished:
                info = flight.pop(future)
                tally.add(_settle(engine, batch, info, future))
            if batch.done != done_before:  # one count per look, for every item done in it
                engine.store.recount_completed(engine.id)
    finally:
        for future, info in flight.items():  # only when the dispatcher itself failed
            future.cancel()
            batch.item_ended(info)
    tally.finish()


def _submit(engine: RunEngine, dispatch: Dispatch, info: StepInfo, task: RemoteTask) -> Any:
    try:
        return dispatch.pool.submit(WORKER, dumps(task))
    except Exception as exc:  # shut down, closed client, ...: the item's step ends here
        text = f"{type(exc).__name__}: {scrub_text(str(exc))}"
        _end_step(engine, info, StepStatus.FAILED, f"not dispatched ({text})")
        raise KernelextError(
            f"run.map(executor={dispatch.label}) could not dispatch item {info.key!r}: {text}. "
            "Is the executor still open (not shut down, its client connected)? The items "
            "completed so far are kept; resume the run with a working executor to run the rest."
        ) from exc


def _task_fields(engine: RunEngine) -> dict[str, Any]:
    from ..._store.postgres_backend import url_without_password

    root = engine.store.chain_root(engine.id)  # read once per batch
    epoch = engine.epoch
    assert epoch is not None  # executor_for refused a run without one
    return {
        "url": url_without_password(engine.store.backend.url),  # type: ignore[attr-defined]
        "run_id": engine.id,
        "epoch": epoch,
        "agent": engine.agent,
        "key_scheme": engine.key_scheme,
        "chain_root": root,
        "max_step_seconds": engine.max_step_seconds,
    }


def _overrun_after_stop(engine: RunEngine, flight: dict[Future[bytes], StepInfo]) -> set[Any]:
    """After a stop, an item past ``max_step_seconds`` is cancelled (the others drain), so
    a stop never waits for a hung worker."""
    limit = engine.max_step_seconds
    if not limit or not engine.stop_event.is_set():
        return set()
    late = {future for future, info in flight.items() if info.elapsed > limit}
    for future in late:
        future.cancel()
    return late


def _settle(engine: RunEngine, batch: Batch, info: StepInfo, future: Future[bytes]) -> Ended:
    """What an item dispatched elsewhere ended with, once its future is done (or was
    cancelled by a forced stop)."""
    index = info.index
    try:
        if not future.done() or future.cancelled():  # a forced stop (or an overrun after it)
            _end_step(engine, info, StepStatus.CANCELLED, "forced stop", forced=True)
            return Ended(index, "stopped", error=ForcedStop("forced stop"))
        lost = future.exception()
        if lost is not None:  # the executor gave up on it: its worker is gone
            gone: BaseException = RemoteItemError(
                f"the worker running it was lost ({type(lost).__name__}: "
                f"{scrub_text(str(lost))}); its calls in flight are unknown until decided "
                f"(kx.reconcile({engine.id!r}))"
            )
            if not _end_step(engine, info, StepStatus.FAILED, scrubbed_excerpt(str(gone), 2000)):
                # an attempt ended the step before its answer was lost (the worker died
                # after writing the item's completion): the step's row says how it ended
                return settle_ended(engine, batch, info, info.elapsed)
            _calls_lost(engine, info, lost)
            return item_raised(engine, batch, info, gone)
        outcome = loads(future.result())
        kind = outcome.kind
        if kind == "ended":  # the step had ended when the attempt came: its row says how
            return settle_ended(engine, batch, info, outcome.elapsed or info.elapsed)
        if kind == "done":
            note_item_done(engine, batch, info, outcome.elapsed or info.elapsed)
            return Ended(index, "done", load_result(outcome.value))
        if kind == "waiting":
            info.waiting = outcome.value
            batch.item_ended(info, "waiting")
            return Ended(index, "waiting", info)
        error = error_from_wire(outcome.error)
        if kind == "lost":
            return Ended(index, "lost", error=error)
        if kind in ("stopped", "decision"):
            return Ended(index, kind, error=error)
        text = scrubbed_excerpt(scrub_text(f"{type(error).__name__}: {error}"), 2000)
        ended_here = _end_step(engine, info, StepStatus.FAILED, text)  # the worker could not
        if not ended_here and _ended(engine, info) != StepStatus.FAILED:  # another attempt did
            return settle_ended(engine, batch, info, outcome.elapsed or info.elapsed)
        return item_raised(engine, batch, info, error)
    except OwnershipLost as exc:
        return Ended(index, "lost", error=exc)
    finally:
        batch.item_ended(info)  # a stopped or lost one (the others have left, counted)


def _calls_lost(engine: RunEngine, info: StepInfo, why: BaseException) -> None:
    """The executor gave up on an item (its worker died): the calls its attempts left
    without an outcome are ``unknown`` now, listed by ``kx.reconcile`` before any resume."""
    epoch = engine.epoch
    if epoch is None:
        return
    reason = (
        f"the worker running this call's item was lost ({type(why).__name__}) before the "
        "call's outcome was recorded: nobody knows whether it happened"
    )
    engine.store.lost_intents_unknown(engine.id, info.key, epoch, reason)


def _end_step(
    engine: RunEngine, info: StepInfo, status: str, why: str, *, forced: bool = False
) -> bool:
    """End an item's step that is still ``running`` (its worker did not, or could not);
    False when it had ended already."""
    return engine.store.end_step(
        engine.id, info.id, status, error=why, forced=forced, duration_s=info.elapsed
    )


def _ended(engine: RunEngine, info: StepInfo) -> str | None:
    """How the item's step ended (None: it is not in the store)."""
    state = engine.store.step_status(info.id)
    return None if state is None else state[0]
