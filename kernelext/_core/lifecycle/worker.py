"""The worker thread that executes a run, and how a run's end is recorded.

``launch`` starts three threads per run: the worker (the agent's code), the monitor
(escalates a stop that overruns ``max_step_seconds``, renews the lease, takes the stops
posted beside a busy store, see ``posted_stops``; never waits for the store) and the
stop-watch (sees stops recorded by other processes).

An ``async def`` agent runs on an event loop of its own, made in the worker thread for
the run and closed after it (``asyncio.run``'s way: tasks left over are cancelled, async
generators and the default executor shut down), so the kernel's loop is never blocked
and ``await run.amap(...)`` has a loop to run its items on (``engine.loop``). The agent's
task is attached to the run's ``ForceGate``: a forced stop cancels it (``forced_stop``,
invariant 7) and its ``CancelledError`` ends the run as that ``ForcedStop`` (suspended,
forced); a soft stop is raised at safe points as for a plain agent.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from ..._formatting import duration_text, step_label
from ..._store import Store, actor
from ..._store.runs import StepEnd
from ...errors import ForcedStop, NeedsDecision, OwnershipLost, StopRequested, StoreWriteError
from ...status import Reason, Status, StepStatus
from ..encoding.secrets import scrub_text, scrubbed_excerpt
from ..engine.context import reset_current_run, set_current_run
from ..engine.groups import unwrap_group
from ..engine.posted_stops import POSTED_POLL_SECONDS, PostedStops
from ..engine.run_engine import STOP_POLL_SECONDS, RunEngine
from ..process.lease import RENEW_SECONDS, lease_until
from ..process.runtime import Runtime, runtime
from .handle import Handle
from .run import engine_of

__all__ = ["end_open_step", "finish_run", "launch", "queue_write", "suspend_run"]

MONITOR_TICK = 0.05
FORCE_POLL_SECONDS = 0.25  # how often a stopping run looks for a force asked elsewhere
_log = logging.getLogger("kernelext")


def launch(
    handle: Handle, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Handle:
    rt = runtime()  # the worker ends its run in the runtime that launched it
    engine = engine_of(handle.run)  # this attempt's (read before the run can end)
    with rt.live_lock:
        rt.live_runs[handle.run_id] = handle
    thread = threading.Thread(
        target=_execute,
        args=(rt, handle, fn, args, kwargs),
        name=f"kernelext-run[{handle.run_id}]",
        daemon=True,
    )
    handle.thread = thread
    thread.start()
    # The monitor and the stop-watch watch this attempt's thread: once the run is resumed,
    # ``handle.thread`` is the newer attempt's (the handle follows its run).
    monitor = threading.Thread(
        target=_monitor,
        args=(handle, engine, thread),
        daemon=True,
        name=f"kernelext-monitor[{handle.run_id}]",
    )
    monitor.start()
    watcher = threading.Thread(
        target=_watch_external_stop,
        args=(handle, engine, thread),
        daemon=True,
        name=f"kernelext-stop-watch[{handle.run_id}]",
    )
    watcher.start()
    return handle


def _execute(
    rt: Runtime,
    handle: Handle,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    run, store = engine_of(handle.run), handle.store
    run.force.thread_id = threading.get_ident()
    token = set_current_run(run)
    outcome: BaseException | None = None
    finished = False
    try:
        result = fn(run.facade, *args, **kwargs)
        if inspect.iscoroutine(result):  # an async def agent: on a loop of its own
            result = _run_coroutine(run, result)
        handle.result = result
        run.enforce_stop("the end of the agent")  # it returned after swallowing a stop
        finished = True
    except BaseException as exc:  # recorded below, after the run is sealed
        outcome = unwrap_group(exc)  # a stop raised inside a task group is that stop
    while True:  # absorb a forced stop that lands after the agent returned
        try:
            run.force.seal()
            break
        except StopRequested as late:
            if not finished and outcome is None:
                outcome = late
    status: str = Status.FAILED
    try:
        if isinstance(outcome, OwnershipLost):  # taken over elsewhere: write nothing more
            raise outcome
        if finished:
            run.finish_open_step()
            status = finish_run(store, run, Status.COMPLETED)
        elif isinstance(outcome, StopRequested):
            status = suspend_run(store, run, outcome)
        elif isinstance(outcome, NeedsDecision):
            open_step = (StepStatus.CANCELLED, str(outcome))
            status = finish_run(store, run, Status.NEEDS_DECISION, str(outcome), open_step)
        else:
            assert outcome is not None
            handle.error = outcome
            text = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
            text = scrub_text(text)
            reason = scrubbed_excerpt(text, 500)
            status = finish_run(store, run, Status.FAILED, reason, (StepStatus.FAILED, text))
    except OwnershipLost as lost:
        status = _lost(handle, lost)
    except Exception as exc:
        handle.error = handle.error or exc
        text = scrub_text("".join(traceback.format_exception_only(type(exc), exc)).strip())
        try:  # (scrubbed before it is cut, as above)
            reason = scrubbed_excerpt(text, 500)
            status = finish_run(store, run, Status.FAILED, reason, (StepStatus.FAILED, text))
        except Exception as fault:  # the store refuses writes: end cleanly anyway
            status = _store_fault(handle, fault)
    finally:
        handle.final_status = status
        run.force.thread_id = None
        with rt.live_lock:
            if rt.live_runs.get(run.id) is handle:
                del rt.live_runs[run.id]
        reset_current_run(token)
        run.notify("end", status)
        rt.run_ended(run.id, status)


def _run_coroutine(run: RunEngine, coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run an async agent's coroutine to its end on a new event loop in this thread."""
    loop = asyncio.new_event_loop()
    run.loop = loop
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(_agent_task(run, coroutine))
    finally:
        try:
            _cancel_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            run.loop = None
            loop.close()


async def _agent_task(run: RunEngine, coroutine: Coroutine[Any, Any, Any]) -> Any:
    gate = run.force
    task = asyncio.current_task()
    assert task is not None
    gate.attach_task(task)
    try:
        return await coroutine
    except asyncio.CancelledError:
        if gate.raised:  # cancelled by a forced stop: the run ends as that stop
            raise ForcedStop("forced stop") from None
        raise


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Tasks the agent started and left running are cancelled and awaited."""
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def _lost(handle: Handle, lost: OwnershipLost) -> str:
    """Another process took the run over: this one's thread ends without another write
    (the new owner's tables are not touched); ``h.error`` says who owns it and how to take
    it back. The status returned is the run's as the store has it now."""
    handle.error = lost
    engine_of(handle.run).current = None
    _log.warning("kernelext: %s", lost)
    try:
        return str(handle.store.get_run(handle.run_id)["status"])
    except Exception:
        return Status.FAILED


def _store_fault(handle: Handle, fault: Exception) -> str:
    """The run ended but the store could not record how: say so, and what to do."""
    run_id = handle.run_id
    if handle.store.closed:
        cause, then = "its store was closed while it ran", "Open the store again and"
    else:
        cause = f"the store could not record its end ({fault})"
        then = "Once the store takes writes again (free space, memory),"
    handle.store_fault = StoreWriteError(
        f"Run {run_id!r} ended, but {cause}. Everything the run stored before is kept (in the "
        f"tables or the journal). {then} call kx.resume({run_id!r}): applied effects are "
        "not repeated, and a call whose outcome was not recorded waits in kx.reconcile."
    )
    handle.store_fault.__cause__ = handle.error or fault  # what went wrong first
    handle.error = handle.store_fault
    _log.error("kernelext: %s", handle.store_fault)
    return Status.FAILED


def end_open_step(store: Store, run: RunEngine, status: str, error: str | None) -> None:
    info = run.current
    if info is not None:
        store.end_step(
            run.id, info.id, status, error=error, forced=run.force.raised, duration_s=info.elapsed
        )
        run.current = None


def _open_step(run: RunEngine, ended: tuple[str, str | None] | None) -> StepEnd | None:
    """The step left open, as the run's end ends it (``ended``: its status and error)."""
    info = run.current
    if info is None or ended is None:
        return None
    return StepEnd(info.id, ended[0], ended[1], run.force.raised, info.elapsed)


def finish_run(
    store: Store,
    run: RunEngine,
    status: Status,
    reason: str | None = None,
    open_step: tuple[str, str | None] | None = None,
) -> str:
    """Record how a live run ended (completed, failed, needs_decision), with the step left
    open ended as ``open_step`` says (status, error); claims of a final run are released
    with it. One record (``Store.end_run``): on DuckDB it never waits for the store file."""
    after = store.end_run(
        run.id,
        status,
        kind=status,
        source="engine",
        reason=reason,
        step=_open_step(run, open_step),
    )
    run.current = None
    return after


def suspend_run(store: Store, run: RunEngine, stop: StopRequested) -> str:
    """Record that a live run stopped at a safe point (or was forced): ``suspended``, with
    the deadline its reason's expiry policy (or ``run.suspend(until=...)``) gives, and the
    step left open cancelled. One record (``Store.end_run``): on DuckDB it never waits for
    the store file, so ``h.wait()`` returns ``suspended`` while another process reads."""
    # A batch forced through its items' gates ends with their ForcedStop: forced too.
    forced = run.force.raised or isinstance(stop, ForcedStop)
    step = _open_step(run, (StepStatus.CANCELLED, "forced stop" if forced else "stopped"))
    if run.suspend_request is not None:
        reason, override, note = run.suspend_request
        source = "agent"
    else:
        reason, override, note = Reason.USER_STOP, None, None
        source = run.stop_source or "api"
    detail: dict[str, Any] = {"forced": forced}  # the deadline is added by the transition
    if note:
        detail["note"] = note
    if run.last_completed is not None:
        detail["last_step"] = run.last_completed.key
    deadline = None
    if override is not None:  # run.suspend(deadline=...) overrides the policy this once
        deadline = store.expiry.deadline(reason, store.now(), override)
    after = store.end_run(
        run.id,
        Status.SUSPENDED,
        kind="stop_forced" if forced else Status.SUSPENDED,
        source=source,
        reason=reason,
        detail=detail,
        deadline=deadline,
        step=step,
    )
    run.current = None
    return after


def _renew_lease(store: Store, run_id: str) -> None:
    """Keep this process's claim on a live run fresh (see ``lease``)."""
    queue_write(store, store.renew_lease, run_id, lease_until(store.now()), actor())


def queue_write(
    store: Store,
    write: Callable[..., None],
    *args: Any,
    who: str = "the run monitor",
    **kwargs: Any,
) -> None:
    """Queue one write of a background thread (``who``: the run monitor, a cell's overrun
    timer); a store that refuses it (closed by its user while the thread runs, read-only,
    failing) never ends the thread, which goes on with what needs no store (the monitor
    still escalates stops): the write is dropped, with a warning unless the store was
    closed."""
    try:
        write(*args, **kwargs)
    except Exception as exc:
        if not store.closed:
            _log.warning("kernelext: %s could not queue a write: %s", who, exc)


def _watch_external_stop(handle: Handle, run: RunEngine, thread: threading.Thread) -> None:
    """Look for a stop that another process recorded in the run's row.

    Such a look may wait for the store file (another process may hold it), so it has a
    thread of its own: the monitor, which escalates stops, never waits for the store.
    """
    while thread.is_alive() and not run.stop_event.is_set():
        run.poll_external_stop(wait=True)
        run.stop_event.wait(STOP_POLL_SECONDS)
    # Stopping: another process may still ask to force it (a panel's Force stop through
    # the server, ``control.force_stop`` elsewhere), and again to cut a call the first
    # force waits for; the monitor raises it at its next tick.
    # Each request is an events row, this process's own included (``Handle.force_stop``
    # wants first, then records): the gate counts the wants it got.
    while thread.is_alive() and not run.force.raised:
        try:
            count, source = handle.store.force_requests(run.id)
        except Exception:  # a store hiccup: look again
            count, source = 0, None
        while run.force.wants < count:
            run.force.want(runtime().settings.force_call_grace)
            run.notify("force", source)
        thread.join(FORCE_POLL_SECONDS)


def _monitor(handle: Handle, run: RunEngine, thread: threading.Thread) -> None:
    """Escalate a pending stop when the current step overruns its time bound.

    Everything it writes is queued (``write_async``): it never waits for the store.
    """
    renewed = 0.0
    posted = PostedStops(handle.store, run)  # stops journaled elsewhere while the file is busy
    while thread.is_alive():
        if time.monotonic() - renewed >= RENEW_SECONDS:
            renewed = time.monotonic()
            _renew_lease(handle.store, run.id)
        time.sleep(MONITOR_TICK)
        posted.take(every=POSTED_POLL_SECONDS)
        info = run.current
        if not run.stop_event.is_set() or info is None:
            if (
                info is not None
                and run.max_step_seconds
                and not info.overrun_reported
                and info.elapsed > run.max_step_seconds
            ):
                info.overrun_reported = True
                queue_write(
                    handle.store,
                    handle.store.record_event,
                    run.id,
                    "step_overran",
                    wait=False,
                    reason=(
                        f"{step_label(info.ordinal, info.key)} passed max_step_seconds "
                        f"({duration_text(run.max_step_seconds)})"
                    ),
                )
            continue
        overran = run.max_step_seconds is not None and info.elapsed > run.max_step_seconds
        at = handle.store.now()  # before the raise: the run's end is dated after it
        if (run.force.wanted or overran) and run.force.try_raise(cut=overran):
            queue_write(
                handle.store,
                handle.store.record_event,
                run.id,
                "force_raised",
                wait=False,
                at=at,
                source="engine",
                reason=(
                    f"{step_label(info.ordinal, info.key)} cancelled after "
                    f"{duration_text(info.elapsed)}"
                ),
            )
