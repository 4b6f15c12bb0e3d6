"""A forced stop: ``ForcedStop`` raised asynchronously into the thread that runs a step.

``h.force_stop()`` (or a stop that overruns ``max_step_seconds``) cannot wait for the next
safe point: the monitor thread raises ``ForcedStop`` into the worker thread with
``PyThreadState_SetAsyncExc``. Such an exception lands at the next bytecode boundary,
wherever the worker is. ``ForceGate`` decides where that may be. Its invariants:

1. **Only the agent's own code is interrupted.** The tool a ``@kx.effect`` wraps runs
   outside any critical section on purpose: a call cut short becomes ``unknown`` in the
   ledger and waits for a decision (``kx.reconcile``).
2. **kernelext's bookkeeping is never interrupted.** Every write that must happen whole or
   not at all (a step begun, a step completed with its snapshot, an effect's intent, an
   approval requested or used, a claim, a fact, a question asked, the events row of a
   swallowed stop) runs inside ``critical()``. While one is open the gate raises nothing
   (``try_raise`` returns False); the monitor tries again at its next tick.
3. **No raise slips between the check and the section.** ``try_raise`` checks and raises
   under a lock; a section that opens after a raise and before its delivery sees
   ``fired`` and first lets the pending exception land (``_let_pending_fire``), before it
   has done anything: the bookkeeping then does not happen at all. (Landing in the
   gate's own few bytecodes is harmless too: nothing was written yet, and the stop is
   spent, so the gate's count of open sections no longer matters.)
4. **Once per run.** A forced stop is raised asynchronously at most once (``spent``). If
   the agent's code swallows it (a bare ``except:``), kernelext raises it again itself,
   synchronously, at its next call: a safe point, an effect call, a critical section or
   the end of the agent (``check``; the run's ``enforce_stop``), and records the swallow
   once (``force_swallowed``).
5. **Sealed after the agent.** From the end of the agent's code on (``seal``) a section
   stays open for good: the run's end is recorded without interruption. A raise already
   on its way is let through there for the caller to absorb, never cancelled: cancelling
   with ``SetAsyncExc(NULL)`` leaves CPython's eval breaker set, which makes traced
   threads (see ``step_skip``) spin forever.
6. **A call blocked in C delays the landing.** A sleep, a socket read without timeout or
   a lock keeps the step running until it returns; ``overrunning`` says for how long, so
   the panel can show it.
8. **A recorded call in flight is not cut at once.** A person's Force stop (the panel,
   ``h.force_stop()``, ■ twice) while the run's thread is inside a sync ``@kx.effect``
   call waits for the call to return, up to ``force_call_grace`` seconds, and lands right
   after its outcome is recorded: a call that returns keeps its real outcome. A second
   Force stop, the grace running out, or a step past ``max_step_seconds`` cuts the call
   (``unknown``). ``waiting_for_call`` says what the stop waits for, for the panel.
   A tool call of an agent framework's run (made on the frameworks' loop or in a thread of
   the framework's while the run's thread waits for it) is held the same way.
   Items of a ``run.map`` are cut at once (their gates never defer).
7. **An async agent's step is a task: it is cancelled, never raised into.** An exception
   raised asynchronously into an event loop's thread could land inside the loop itself.
   For a gate attached to a task (``attach_task``: an ``async def`` agent, an
   ``run.amap`` item), ``try_raise`` asks the loop to cancel the task instead; the
   ``CancelledError`` lands at the task's next ``await`` (an awaited effect: ``unknown``),
   and kernelext treats it as the ``ForcedStop``. kernelext's bookkeeping runs without an
   ``await``, or in a thread the task awaits (an intent's durable write, ``ledger.effect_async``;
   an item's end): no cancellation lands inside it (invariant 2), and one that reaches
   the task's wait for such a thread waits for it to end. A section that opens while the
   cancel is still queued withdraws it and lands the stop there (invariant 3).
   Sync code blocking the loop (a plain ``def`` call in the task) delays the landing to
   the task's next ``await``, as invariant 6 says.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ...errors import ForcedStop

__all__ = ["ForceGate"]


class ForceGate:
    """Where a forced stop may land in one run's worker thread (see the module's text).

    ``landed(swallowed_at)`` is told each time the forced stop goes on up to the agent:
    ``None`` when it lands now, else where kernelext raised it again after the agent's code
    swallowed it.
    """

    def __init__(self, landed: Callable[[str | None], None]) -> None:
        self._landed = landed
        self.thread_id: int | None = None  # the worker thread, while the agent runs
        self.wanted = False  # h.force_stop(): force at the next monitor tick
        self.raised = False  # a forced stop was raised into (or cut) the run's step
        self.raised_at: float | None = None  # time.monotonic() of the raise
        self._lock = threading.Lock()
        self._guard = 0  # critical sections open (and 1 for good once sealed)
        self._fired = False  # raised into the worker, not yet seen by kernelext
        self._spent = False  # raised once: never raised asynchronously again
        self._task: asyncio.Task[Any] | None = None  # cancelled instead (invariant 7)
        self._cancel: str | None = None  # None, "queued", "sent" or "withdrawn"
        self._calls = 0  # recorded calls in flight (invariant 8)
        self.call_tool: str | None = None
        self.wanted_at: float | None = None  # time.monotonic() of the first Force stop
        self.grace = 0.0  # seconds a Force stop waits for a call in flight
        self.cut = False  # a second Force stop: cut the call in flight now
        self.wants = 0  # Force stops asked for (here or, read from the store, elsewhere)

    def want(self, grace: float, *, cut: bool = False) -> None:
        """A person's Force stop: raised at the next chance, after a call in flight returns
        (within ``grace`` seconds); a second one while a call is in flight, or ``cut``,
        cuts it."""
        with self._lock:
            self.wants += 1
            if cut or (self.wanted and self._calls):
                self.cut = True
            if not self.wanted:
                self.wanted_at = time.monotonic()
                self.grace = grace
            self.wanted = True

    @contextlib.contextmanager
    def in_call(self, tool: str) -> Iterator[None]:
        """A recorded call, from its intent to its outcome: a Force stop waits (invariant 8)."""
        with self._lock:
            self._calls += 1
            self.call_tool = tool
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1
                if not self._calls:
                    self.call_tool = None

    def waiting_for_call(self) -> tuple[str, float, float] | None:
        """(tool, seconds waited, seconds until it is cut) while a Force stop waits for a
        call in flight to return; else None."""
        with self._lock:
            if not (self.wanted and self._calls) or self._spent or self.wanted_at is None:
                return None
            waited = time.monotonic() - self.wanted_at
            return (self.call_tool or "a call", waited, max(0.0, self.grace - waited))

    def _call_holds(self, cut: bool) -> bool:
        """A call in flight keeps the Force stop waiting (call under the lock)."""
        if not self._calls or cut or self.cut or self.wanted_at is None:
            return False
        return time.monotonic() - self.wanted_at < self.grace

    def attach_task(self, task: asyncio.Task[Any]) -> None:
        """A forced stop cancels ``task`` (an async agent's, or a ``run.amap`` item's)
        rather than raising into the thread that runs its loop (invariant 7)."""
        self._task = task
        self.thread_id = threading.get_ident()

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """kernelext's bookkeeping inside: no forced stop lands in it (invariants 2, 3)."""
        with self._lock:
            self._guard += 1
            fired = self._fired
            self._fired = False
        if fired:
            with self._lock:
                self._guard -= 1
            self._land("kernelext's next call")
        try:
            yield
        finally:
            with self._lock:
                self._guard -= 1

    def check(self, where: str) -> None:
        """A forced stop raised into this thread and not seen since lands (or is raised
        again) here, before kernelext does anything else (invariant 4)."""
        with self._lock:
            fired = self._fired
            self._fired = False
        if fired:
            self._land(where)

    @property
    def pending(self) -> bool:
        """A forced stop was raised and kernelext has not seen it since."""
        return self._fired

    def seal(self) -> None:
        """From here on kernelext's bookkeeping runs; no forced stop may land in it.

        A forced stop already raised into this thread is let through here (the caller
        absorbs it) rather than cancelled (invariant 5).
        """
        with self._lock:
            self._guard += 1
            fired = self._fired
            self._fired = False
            if self._cancel == "queued":  # the task ended: nothing left to cancel
                self._cancel = "withdrawn"
        if fired and self._task is None:
            _let_pending_fire()

    def try_raise(self, *, cut: bool = False) -> bool:
        """Raise ForcedStop in the worker unless it is inside kernelext's own code, or in a
        recorded call a person's Force stop still waits for (``cut``: do not wait).

        Once per run: a forced stop the agent's code swallows is raised again by kernelext
        at its next call, never raised asynchronously a second time (invariant 4).
        """
        with self._lock:
            task = self._task
            if self._guard or self.thread_id is None or self._spent or self._call_holds(cut):
                return False
            if task is not None and task.done():
                return False
            self._fired = self._spent = True
            self.raised = True
            self.raised_at = time.monotonic()
            if task is None:
                return _set_async_exc(self.thread_id, ForcedStop)
            self._cancel = "queued"
        try:
            task.get_loop().call_soon_threadsafe(self._cancel_task)
        except RuntimeError:  # the loop is closed: the task ended with it
            return False
        return True

    def _cancel_task(self) -> None:
        """In the task's loop: cancel it, unless kernelext landed the stop meanwhile."""
        with self._lock:
            task = self._task
            if self._cancel != "queued" or task is None:
                return
            self._cancel = "sent"
        task.cancel()
        self._landed(None)

    def overrunning(self, step_open: bool) -> float | None:
        """Seconds since a forced stop was raised into a step that still runs, else None
        (invariant 6). ``step_open``: the run has a step open now."""
        raised = self.raised_at
        if raised is None or not step_open or self.thread_id is None:
            return None
        return time.monotonic() - raised

    def _land(self, where: str) -> NoReturn:
        if self._task is not None:  # invariant 7: cancelled (then swallowed), or not yet
            with self._lock:
                sent = self._cancel == "sent"
                self._cancel = "sent" if sent else "withdrawn"
            if not sent:
                self._landed(None)
                raise ForcedStop("forced stop")
        else:
            try:
                _let_pending_fire()  # still pending: it lands here and goes on up to the agent
            except ForcedStop:
                self._landed(None)
                raise
        # It landed earlier, in the agent's code, which swallowed it.
        self._landed(where)
        raise ForcedStop("forced stop, raised again: the agent's code swallowed it")


def _let_pending_fire() -> None:
    """Run a few bytecodes so that a pending asynchronous exception is delivered now."""
    for _ in range(100):
        pass


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> bool:
    obj = ctypes.py_object(exc) if exc is not None else None
    count = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)
    return bool(count == 1)
