"""Agents, handles, and the worker thread that executes a run."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, overload

from ..errors import NeedsDecision, StopRequested, StoreWriteError
from ..store import Store, actor
from .context import reset_current_run, set_current_run
from .lease import RENEW_SECONDS, lease_until
from .registry import AGENTS, END_HOOKS, HANDLES, LIVE, LIVE_LOCK
from .run import STOP_POLL_SECONDS, Run
from .secrets import scrub_text
from .settings import SETTINGS

__all__ = ["Agent", "Handle", "agent", "fingerprint"]

FINAL = frozenset({"completed", "failed", "cancelled", "expired"})
MONITOR_TICK = 0.05
_log = logging.getLogger("kernelext")


def fingerprint(fn: Callable[..., Any]) -> str:
    """A hash of the agent's source (or bytecode when the source is not available)."""
    try:
        text = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = code.co_code if code is not None else repr(fn).encode()
    return hashlib.sha256(text).hexdigest()[:16]


class Handle:
    """A run executing (or finished) in this process. Displays as its control panel."""

    def __init__(self, run: Run, store: Store) -> None:
        self.run = run
        self.store = store
        self.run_id = run.id
        self.thread: threading.Thread | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.final_status: str | None = None
        self.store_fault: StoreWriteError | None = None  # the store refused the run's end
        self._done = threading.Event()
        HANDLES[self.run_id] = self

    # -- status ---------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def status(self) -> str:
        return str(self.store.get_run(self.run_id)["status"])

    def info(self) -> dict[str, Any]:
        return self.store.get_run(self.run_id)

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run stops, suspends or finishes; return its status."""
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                return "running"
        if self.final_status is not None and (self.store.closed or self.store_fault):
            return self.final_status
        return self.status

    # -- control --------------------------------------------------------------------
    def stop(self, source: str = "api", *, who: str | None = None) -> str:
        """Ask the run to stop at its next safe point. Returns the status after the request.

        A run executing here returns ``"stopping"`` at once: the request never waits for
        the store (see ``request_stop``).
        """
        return request_stop(self.store, self.run_id, source=source, who=who, handle=self)

    def force_stop(self, source: str = "api") -> None:
        """Stop now: raise into the step. In-flight effects become ``unknown``."""
        self.stop(source)
        self.run.force_wanted = True
        self.store.record_event(self.run_id, "force_requested", source=source, wait=False)

    def resume(self, **kwargs: Any) -> Handle:
        from .resume import resume

        return resume(self.run_id, store=self.store, **kwargs)

    def steps(self) -> list[dict[str, Any]]:
        return self.store.steps(self.run_id)

    def events(self) -> list[dict[str, Any]]:
        return self.store.events(self.run_id)

    def __repr__(self) -> str:
        return f"<kernelext run {self.run_id!r} status={self.status}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = SETTINGS.handle_renderer
        if renderer is None:
            return {"text/plain": self.text_summary()}
        return renderer(self)

    def text_summary(self) -> str:
        info = self.info()
        total = info.get("total_steps")
        done = info.get("completed_steps")
        progress = f"{done}/{total} steps" if total else f"{done} steps"
        line = f"run {self.run_id} [{info['agent']}]: {info['status']}, {progress}"
        if info.get("reason"):
            line += f" ({info['reason']})"
        if info.get("deadline") and info["status"] == "suspended":
            line += f", expires {info['deadline']:%Y-%m-%d %H:%M} UTC"
        return line


def request_stop(
    store: Store, run_id: str, *, source: str, who: str | None = None, handle: Handle | None = None
) -> str:
    """Ask run ``run_id`` to stop; return its status after the request.

    A run executing in this process is stopped without waiting for the store (another
    process may hold the DuckDB file for a while): the request is queued (journaled),
    the run's flag is raised, then the request is made durable (``fdatasync``). The
    answer is ``"stopping"``, known without reading the store. Any other run: the request
    is written to its row, where its owner's monitor sees it.
    """
    from .registry import live_handle

    handle = handle or live_handle(run_id)
    if handle is None or not handle.alive:
        result = store.request_stop(run_id, source=source, who=who)
        return result.after or "unknown"
    try:
        # Queued before the flag goes up, so the request is folded before the suspension
        # the worker writes once it sees the flag (the events keep their order).
        durable = handle.store.queue_stop_request(run_id, source=source, who=who)
    finally:
        _raise_stop_flag(handle.run, source)  # even if the request could not be queued
    durable()
    return "stopping"


def _raise_stop_flag(run: Run, source: str) -> None:
    if run.stop_source is None:
        run.stop_source = source
    run.stop_event.set()
    run.notify("stop", source)


class Agent:
    """What ``@kx.agent`` returns: call ``.start(...)`` to run it in the background."""

    def __init__(
        self, fn: Callable[..., Any], name: str, max_step_seconds: float | None, pickle: bool
    ) -> None:
        self.fn = fn
        self.name = name
        self.max_step_seconds = max_step_seconds
        self.pickle = pickle
        self.fingerprint = fingerprint(fn)
        functools.update_wrapper(self, fn)

    def start(
        self, *args: Any, run_id: str | None = None, store: Store | None = None, **kwargs: Any
    ) -> Handle:
        """Start a new run in a worker thread and return its handle at once."""
        from .starting import start_run

        return start_run(self, args, kwargs, run_id=run_id, store=store)

    def run(
        self, *args: Any, run_id: str | None = None, store: Store | None = None, **kwargs: Any
    ) -> Handle:
        """Start and wait: for scripts and tests."""
        handle = self.start(*args, run_id=run_id, store=store, **kwargs)
        handle.wait()
        return handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<kernelext agent {self.name!r}>"


@overload
def agent(fn: Callable[..., Any], /) -> Agent: ...


@overload
def agent(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    max_step_seconds: float | None = None,
    pickle: bool = False,
) -> Callable[[Callable[..., Any]], Agent]: ...


def agent(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    max_step_seconds: float | None = None,
    pickle: bool = False,
) -> Agent | Callable[[Callable[..., Any]], Agent]:
    """Declare an agent: ``@kx.agent(name="triage", max_step_seconds=60)``."""

    def wrap(func: Callable[..., Any]) -> Agent:
        made = Agent(func, name or func.__name__, max_step_seconds, pickle)
        AGENTS[made.name] = made
        return made

    return wrap(fn) if fn is not None else wrap


# -- executing a run in its worker thread ------------------------------------------------
def launch(
    handle: Handle, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Handle:
    with LIVE_LOCK:
        LIVE[handle.run_id] = handle
    thread = threading.Thread(
        target=_execute,
        args=(handle, fn, args, kwargs),
        name=f"kernelext-run[{handle.run_id}]",
        daemon=True,
    )
    handle.thread = thread
    thread.start()
    monitor = threading.Thread(
        target=_monitor, args=(handle,), daemon=True, name=f"kernelext-monitor[{handle.run_id}]"
    )
    monitor.start()
    watcher = threading.Thread(
        target=_watch_external_stop,
        args=(handle,),
        daemon=True,
        name=f"kernelext-stop-watch[{handle.run_id}]",
    )
    watcher.start()
    return handle


def _execute(
    handle: Handle, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    run, store = handle.run, handle.store
    run.thread_id = threading.get_ident()
    token = set_current_run(run)
    outcome: BaseException | None = None
    finished = False
    try:
        handle.result = fn(run, *args, **kwargs)
        run.enforce_stop("the end of the agent")  # it returned after swallowing a stop
        finished = True
    except BaseException as exc:  # recorded below, after the run is sealed
        outcome = exc
    while True:  # absorb a forced stop that lands after the agent returned
        try:
            run.seal()
            break
        except StopRequested as late:
            if not finished and outcome is None:
                outcome = late
    status = "failed"
    try:
        if finished:
            run.finish_open_step()
            status = _finish(store, run, "completed")
        elif isinstance(outcome, StopRequested):
            status = _suspend(store, run, outcome)
        elif isinstance(outcome, NeedsDecision):
            _end_open_step(store, run, "cancelled", str(outcome))
            status = _finish(store, run, "needs_decision", reason=str(outcome))
        else:
            assert outcome is not None
            handle.error = outcome
            text = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
            text = scrub_text(text)  # before it is cut: no half secret left behind
            _end_open_step(store, run, "failed", text)
            status = _finish(store, run, "failed", reason=text[:500])
    except Exception as exc:
        handle.error = handle.error or exc
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        try:
            _end_open_step(store, run, "failed", text)
            status = _finish(store, run, "failed", reason=text[:500])
        except Exception as fault:  # the store refuses writes: end cleanly anyway
            status = _store_fault(handle, fault)
    finally:
        handle.final_status = status
        run.thread_id = None
        with LIVE_LOCK:
            if LIVE.get(run.id) is handle:
                del LIVE[run.id]
        reset_current_run(token)
        run.notify("end", status)
        for hook in list(END_HOOKS):
            try:
                hook(run.id, status)
            except Exception:
                continue


def _store_fault(handle: Handle, fault: Exception) -> str:
    """The run ended but the store could not record how: say so, and what to do."""
    run_id = handle.run_id
    handle.store_fault = StoreWriteError(
        f"Run {run_id!r} ended, but the store could not record its end ({fault}). Everything "
        "the run stored before is kept (in the tables or the journal). Once the store takes "
        f"writes again (free space, memory), call kx.resume({run_id!r}): applied effects are "
        "not repeated, and a call whose outcome was not recorded waits in kx.reconcile."
    )
    handle.store_fault.__cause__ = handle.error or fault  # what went wrong first
    handle.error = handle.store_fault
    _log.error("kernelext: %s", handle.store_fault)
    return "failed"


def _end_open_step(store: Store, run: Run, status: str, error: str | None) -> None:
    info = run.current
    if info is not None:
        error = scrub_text(error) if error is not None else None
        store.end_step(
            run.id, info.id, status, error=error, forced=run.forced, duration_s=info.elapsed
        )
        run.current = None


def _finish(store: Store, run: Run, status: str, reason: str | None = None) -> str:
    reason = scrub_text(reason) if reason is not None else None  # runs.reason: no secrets

    def job(tx: Any) -> str:
        waiting = SETTINGS.waiting_fields(store) if status == "needs_decision" else None
        result = store.transition_tx(
            tx,
            run.id,
            status,
            ("running", "stopping"),
            kind=status,
            reason=reason,
            source="engine",
            fields=waiting,
        )
        if result.ok and status in FINAL:
            store.release_run_claims_tx(tx, run.id, status)
        return str(result.after)

    return str(store.write(job))


def _suspend(store: Store, run: Run, stop: StopRequested) -> str:
    forced = run.forced
    _end_open_step(store, run, "cancelled", "forced stop" if forced else "stopped")
    if run.suspend_request is not None:
        reason, override, note = run.suspend_request
        source = "agent"
    else:
        reason, override, note = "user_stop", None, None
        source = run.stop_source or "api"
    deadline = SETTINGS.expiry.deadline(reason, store.now(), override)
    detail: dict[str, Any] = {"forced": forced, "deadline": deadline.isoformat()}
    if note:
        detail["note"] = note
    if run.last_completed is not None:
        detail["last_step"] = run.last_completed.key
    result = store.transition(
        run.id,
        "suspended",
        ("running", "stopping"),
        kind="stop_forced" if forced else "suspended",
        reason=reason,
        source=source,
        detail=detail,
        fields={"deadline": deadline},
    )
    return str(result.after)


def _renew_lease(store: Store, run_id: str) -> None:
    """Keep this process's claim on a live run fresh (see ``lease``)."""
    store.renew_lease(run_id, lease_until(store.now()), actor())


def _watch_external_stop(handle: Handle) -> None:
    """Look for a stop that another process recorded in the run's row.

    Such a look may wait for the store file (another process may hold it), so it has a
    thread of its own: the monitor, which escalates stops, never waits for the store.
    """
    run = handle.run
    while handle.thread is not None and handle.thread.is_alive() and not run.stop_event.is_set():
        run.poll_external_stop(wait=True)
        run.stop_event.wait(STOP_POLL_SECONDS)


def _monitor(handle: Handle) -> None:
    """Escalate a pending stop when the current step overruns its time bound.

    Everything it writes is queued (``write_async``): it never waits for the store.
    """
    run = handle.run
    renewed = 0.0
    while handle.thread is not None and handle.thread.is_alive():
        if time.monotonic() - renewed >= RENEW_SECONDS:
            renewed = time.monotonic()
            _renew_lease(handle.store, run.id)
        time.sleep(MONITOR_TICK)
        info = run.current
        if not run.stop_event.is_set() or info is None:
            if (
                info is not None
                and run.max_step_seconds
                and not info.overrun_reported
                and info.elapsed > run.max_step_seconds
            ):
                info.overrun_reported = True
                handle.store.record_event(
                    run.id,
                    "step_overran",
                    wait=False,
                    reason=f"step {info.key!r} passed max_step_seconds={run.max_step_seconds}",
                )
            continue
        overran = run.max_step_seconds is not None and info.elapsed > run.max_step_seconds
        if (run.force_wanted or overran) and run.try_force():
            handle.store.record_event(
                run.id,
                "force_raised",
                wait=False,
                source="engine",
                reason=f"step {info.key!r} cancelled after {info.elapsed:.1f}s",
            )
