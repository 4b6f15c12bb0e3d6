"""The ``run`` object an agent receives: steps, state, and the safe points between them."""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, TracebackType
from typing import Any, NoReturn, TypeVar

from .._store import Store
from .._store.runs import KEY_SCHEME
from .._store.steps import StagedPayload
from .._validate import (
    FUNCTION,
    NOTE,
    check_amount,
    check_deadline,
    check_iterable,
    check_name,
    optional,
    validated,
)
from ..errors import ForcedStop, KernelextError, NeedsDecision, StopRequested
from ..status import Reason, StepStatus
from .names import check_stored_name
from .snapshot import Snapshotter

__all__ = ["Run", "StepInfo", "chain_roots"]

T = TypeVar("T")
OUTSIDE_STEPS = "__run__"
STOP_POLL_SECONDS = 0.1  # how often a safe point looks for a stop recorded by another process


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

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


class _SkipBody(Exception):
    pass


class StopFlag(threading.Event):
    """The run's stop flag. ``delivered`` remembers the stop kernelext raised into the agent
    (``StopRequested`` or ``ForcedStop``) so that it is raised again at every later safe
    point and effect call if the agent's code swallows it; clearing the flag forgets it."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: type[StopRequested] | None = None
        self.swallowed_noted: set[str] = set()  # events already recorded for this stop

    def clear(self) -> None:
        self.delivered = None
        self.swallowed_noted = set()
        super().clear()


# run -> the first run of its restart chain (the idempotency keys handed to tools derive
# from it: ``ledger.idempotency_key_for``); set where a run starts or is resumed.
chain_roots: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


class Run:
    """Passed to the agent function. Everything here is safe to call from the agent."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        agent: str,
        *,
        max_step_seconds: float | None,
        allow_pickle: bool = False,
        total_steps: int | None = None,
        key_scheme: int | None = KEY_SCHEME,
    ) -> None:
        self.store = store
        self.id = run_id
        # How this run's effect keys and argument hashes are derived (kernelext._core.keys):
        # a run row's key_scheme, NULL (scheme 1) for a run recorded by an earlier release.
        self.key_scheme = key_scheme or 1
        self.agent = agent
        self.max_step_seconds = max_step_seconds
        self.state: dict[str, Any] = {}
        self.total_steps = total_steps
        self.snapshotter = Snapshotter(run_id, allow_pickle=allow_pickle)
        self.completed: dict[str, int] = {}
        self.effects: dict[uuid.UUID, dict[str, Any]] = {}
        self.current: StepInfo | None = None
        self.last_completed: StepInfo | None = None
        self._outside_calls = 0
        self._ordinal = 0
        self._top_ordinal: int | None = None  # highest ordinal completed or begun
        self._seen: set[str] = set()
        self.stop_event = StopFlag()
        # time.monotonic() of a safe point's last look at the store's stop flag. Only safe
        # points count: a look by the monitor that began before a request landed must not
        # let the next safe point skip its own look.
        self._stop_polled = 0.0
        self.stop_source: str | None = None
        self.force_wanted = False
        self.forced = False
        self.thread_id: int | None = None
        self._guard = 0
        self._guard_lock = threading.Lock()
        self._force_fired = False  # raised into the worker, not yet seen by kernelext
        self._force_spent = False  # a forced stop is raised into the worker once per run
        self.force_raised_at: float | None = None  # time.monotonic() of that
        self.listeners: list[Callable[[str, Any], None]] = []
        self.suspend_request: tuple[str, Any, str | None] | None = None

    # -- what agents call ---------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.id

    @property
    def epoch(self) -> int | None:
        """The ownership epoch this process holds for the run (None: it never took it
        over); its writes carry it and are refused once another process took the run."""
        return self.store.held_epoch(self.id)

    @property
    def stop_requested(self) -> bool:
        return self.stop_event.is_set()

    @validated("run.steps", items=check_iterable, key=optional(FUNCTION), name=optional(check_name))
    def steps(
        self, items: Iterable[T], key: Callable[[T], Any] | None = None, name: str | None = None
    ) -> Iterator[T]:
        """Yield each item as one step. Completed items are skipped on resume.

        ``key`` gives each item a stable identity (default: its position). Between
        items is a safe point: a pending stop takes effect there.
        """
        if self.total_steps is None:
            try:
                total = len(items)  # type: ignore[arg-type]
            except TypeError:
                total = None
            if total is not None:
                total += len(self.completed)  # steps done before the loop (run.step) count too
                self.total_steps = total
                self.store.write_async(
                    lambda tx: self.store.update_run_tx(tx, self.id, total_steps=total)
                )
                self.notify("total", total)
        for index, item in enumerate(items):
            step_key = _step_key(key(item)) if key is not None else str(index)
            if not self.begin_step(step_key, name):
                continue
            yield item
        self.finish_open_step()
        self.safe_point()

    def step(self, name: str, key: str | None = None) -> _StepContext:
        """``with run.step("fetch"):`` — one step; skipped on resume once completed."""
        if type(name) is not str or (key is not None and type(key) is not str):  # cheap
            check_name("run.step(name=...)", name)
            if key is not None:
                check_name("run.step(key=...)", key)
        return _StepContext(self, key or name, name)

    def checkpoint(self) -> None:
        """An explicit safe point: honours a pending stop here."""
        self.safe_point()

    @validated("run.suspend", reason=check_name, deadline=check_deadline, note=NOTE)
    def suspend(
        self, reason: str = Reason.OTHER, *, deadline: Any = None, note: str | None = None
    ) -> None:
        """Suspend the run at this point (a safe point); resume with ``kx.resume``.

        ``deadline``: when the suspended run expires; ``None`` takes the reason's expiry
        policy. A ``datetime`` (naive is read as UTC, like every timestamp in the store;
        aware is converted to UTC), or a duration from now (seconds or a ``timedelta``, at
        most 1000 years). A deadline in the past is accepted: the run expires at the next
        sweep.
        """
        self.finish_open_step()
        self.suspend_request = (reason, deadline, note)
        raise StopRequested(reason)

    def claim(self, resource: str, amount: float | None = None) -> Any:
        """Hold ``resource`` until the run ends (completed, cancelled, expired).

        Exclusive per resource name; a second claim by this run is a no-op. Another
        live or suspended run holding it makes this raise ``ClaimConflict``.
        """
        from .claims import claim

        return claim(self, resource, amount)

    def ask(self, prompt: str, *, schema: Any = None, default: Any = None) -> Any:
        """Ask a person and return the answer: the run suspends here (reason ``input``)
        until ``kx.answer(run_id, value)``; every later resume returns the stored answer
        without asking. ``schema``: ``str``, ``int``, ``float``, ``bool``, a list of
        choices, or a JSON-schema dict for a small form; ``default`` pre-fills the input.
        The step around the question runs again on resume (its effects are replayed)."""
        from .questions import ask

        return ask(self, prompt, schema=schema, default=default)

    @validated(
        "run.fact",
        name=check_name,
        check=optional(FUNCTION),
        tolerance=optional(check_amount),
        kind=check_name,
        compare=optional(FUNCTION),
    )
    def fact(
        self,
        name: str,
        value: Any,
        check: Callable[..., Any] | None = None,
        args: Iterable[Any] = (),
        *,
        tolerance: float | None = None,
        kind: str = "value",
        compare: Callable[[Any, Any], Any] | None = None,
    ) -> Any:
        """Record a premise the rest of the run depends on; returns ``value``.

        ``check(*args)`` must give the current value again on resume: a named
        (module- or notebook-level) function, found by name in a fresh kernel, with
        JSON ``args``. On resume every fact of the completed steps is re-checked
        before anything runs; equality by default, ``tolerance`` for numbers, or
        ``compare(recorded, current) -> bool``. A contradiction stops the resume in
        ``needs_decision`` (see ``kx.revalidation``). ``kind="credential"``: the
        value is never stored (only a fingerprint); on resume it is refreshed by
        ``kx.credentials.register(name, refresh=fn)``; read it with
        ``run.credential(name)``.
        """
        from .facts import record_fact

        return record_fact(
            self, name, value, check, args, tolerance=tolerance, kind=kind, compare=compare
        )

    @validated("run.credential", name=check_name)
    def credential(self, name: str) -> Any:
        """The current value of a credential fact (the refreshed one after a resume)."""
        from .credentials import current

        return current(self, name)

    # -- engine side --------------------------------------------------------------
    def notify(self, what: str, value: Any = None) -> None:
        for listener in list(self.listeners):
            try:
                listener(what, value)
            except Exception:
                continue

    def safe_point(self) -> None:
        if self._force_fired:  # a forced stop the agent's code swallowed: raised again here
            self._check_force("a safe point")
        if self.id in self.store.quarantined_runs:
            raise NeedsDecision(
                f"A record of run {self.id!r} was refused by the store and quarantined; the "
                "run waits for a decision. See kx.sql('SELECT * FROM quarantine') and the "
                "run's events."
            )
        if not self.stop_event.is_set():
            self.poll_external_stop()
        if self.stop_event.is_set():
            self.enforce_stop("a safe point")  # swallowed before: raised again, and recorded
            self._deliver(StopRequested)

    def enforce_stop(self, where: str) -> None:
        """Raise again a stop that the agent's code swallowed (a bare ``except:``).

        Called at every safe point, every effect call and when the agent function returns.
        Once kernelext raised a stop into the agent, each of them raises it again, so a
        swallowed stop costs at most the rest of one step. Cheap when nothing is pending.
        """
        if self._force_fired:
            self._check_force(where)
        flag = self.stop_event
        if flag.delivered is not None and flag.is_set():
            forced = flag.delivered is ForcedStop
            self._note_swallowed("force_swallowed" if forced else "stop_swallowed", where)
            self._deliver(flag.delivered)

    def _deliver(self, kind: type[StopRequested]) -> NoReturn:
        """Raise ``kind`` into the agent, remembering it (see ``StopFlag``)."""
        flag = self.stop_event
        if flag.delivered is not ForcedStop:  # a forced stop stays forced
            flag.delivered = kind
        raise kind(self.stop_source or "stop")

    def _note_swallowed(self, kind: str, where: str) -> None:
        """One events row per stop: the agent's code caught it and went on."""
        flag = self.stop_event
        if kind in flag.swallowed_noted:
            return
        flag.swallowed_noted.add(kind)
        what = "a forced stop (ForcedStop)" if kind == "force_swallowed" else "the stop"
        reason = (
            f"the agent's code caught {what} and went on (a bare except:, except "
            f"BaseException, or a finally block calling kernelext); raised again at {where}"
        )
        info = self.current
        detail = {"step": info.key} if info is not None else None
        with self.critical():  # queued, never waited for; no forced stop lands in it
            with contextlib.suppress(Exception):  # a store hiccup must not hold the stop back
                self.store.record_event(
                    self.id, kind, wait=False, source="engine", reason=reason, detail=detail
                )
            self.notify(kind, where)

    def poll_external_stop(self, *, wait: bool = False) -> bool:
        """Raise the flag when another process recorded a stop in the store.

        ``kernelext stop`` or ``kx.stop`` in another kernel only writes the request into
        the store. The run's monitor thread reads it (``wait=True``, it may wait for the
        store); a safe point also looks, at most every ``STOP_POLL_SECONDS`` and only if
        the store answers at once, so safe points stay cheap. A safe point at least
        ``STOP_POLL_SECONDS`` after the previous one always looks, so a stop recorded
        before it is honoured there, within the step that was running.
        """
        now = time.monotonic()
        if not wait and now - self._stop_polled < STOP_POLL_SECONDS:
            return False
        try:
            request = self.store.stop_request(self.id, wait=wait)
        except Exception:  # a store hiccup must not break the agent; poll again later
            return False
        if request is None:  # the store was busy: try again at the next chance
            return False
        if not wait:
            self._stop_polled = now
        requested_at, source = request
        if requested_at is None or self.stop_event.is_set():
            return False
        if self.stop_source is None:
            self.stop_source = source or "external"
        self.stop_event.set()
        self.notify("stop", self.stop_source)
        return True

    def begin_step(self, key: str, name: str | None) -> bool:
        """Open a step. Returns False when it completed before (resume)."""
        self.finish_open_step()
        check_stored_name(
            key,
            "step key",
            hint="Give run.steps(key=...) a function that returns a short printable text "
            "(or int) for each item, or run.step() such a name.",
        )
        self.safe_point()
        if key in self._seen:
            raise KernelextError(
                f"Step key {key!r} is used twice in run {self.id!r}. Step keys must be unique "
                "within a run: pass key= to run.steps() or use distinct names in run.step()."
            )
        self._seen.add(key)
        ordinal = self._ordinal
        self._ordinal += 1
        if key in self.completed:
            return False
        # A new step never reuses the ordinal of a step completed before a resume (the
        # items may come in another order now): snapshots are ordered by step ordinal.
        if self._top_ordinal is None:
            self._top_ordinal = max(self.completed.values(), default=-1)
        ordinal = max(ordinal, self._top_ordinal + 1)
        self._top_ordinal = ordinal
        info = StepInfo(uuid.uuid4(), key, ordinal, name)
        with self.critical():
            self.store.begin_step(self.id, info.id, ordinal, key, name)
            self.current = info
        self.notify("step", info)
        return True

    def _stage(self, payload: bytes) -> StagedPayload | None:
        return self.store.stage_payload(self.id, payload)

    def finish_open_step(self) -> None:
        info = self.current
        if info is None:
            return
        with self.critical():
            manifest, blobs, size = self.snapshotter.take(self.state, self._stage)
            self.store.complete_step(
                self.id, info.id, info.ordinal, info.elapsed, manifest, blobs, size
            )
            self.snapshotter.committed()
            self.completed[info.key] = info.ordinal
            self.current = None
            self.last_completed = info
        self.notify(StepStatus.COMPLETED, info)

    def next_call(self) -> tuple[str, int | None, int]:
        """The (step key, step ordinal, call ordinal) for the next effect call."""
        info = self.current
        if info is None:
            ordinal = self._outside_calls
            self._outside_calls += 1
            return OUTSIDE_STEPS, None, ordinal
        ordinal = info.calls
        info.calls += 1
        return info.key, info.ordinal, ordinal

    # -- forced stop: raise into the worker, never inside kernelext's bookkeeping ---
    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        with self._guard_lock:
            self._guard += 1
            fired = self._force_fired
            self._force_fired = False
        if fired:
            with self._guard_lock:
                self._guard -= 1
            self._land_force("kernelext's next call")
        try:
            yield
        finally:
            with self._guard_lock:
                self._guard -= 1

    def _check_force(self, where: str) -> None:
        """A forced stop raised into this thread and not seen since lands (or is raised
        again) here, before kernelext does anything else."""
        with self._guard_lock:
            fired = self._force_fired
            self._force_fired = False
        if fired:
            self._land_force(where)

    def _land_force(self, where: str) -> NoReturn:
        try:
            _let_pending_fire()  # still pending: it lands here and goes on up to the agent
        except ForcedStop:
            self.stop_event.delivered = ForcedStop
            raise
        # It landed earlier, in the agent's code, which swallowed it.
        self._note_swallowed("force_swallowed", where)
        self.stop_event.delivered = ForcedStop
        raise ForcedStop("forced stop, raised again: the agent's code swallowed it")

    def seal(self) -> None:
        """From here on kernelext's bookkeeping runs; no forced stop may land in it.

        A forced stop already raised into this thread is let through here (the caller
        absorbs it) rather than cancelled: cancelling one with ``SetAsyncExc(NULL)``
        leaves CPython's eval breaker set, which makes traced threads spin forever.
        """
        with self._guard_lock:
            self._guard += 1
            fired = self._force_fired
            self._force_fired = False
        if fired:
            _let_pending_fire()

    def try_force(self) -> bool:
        """Raise ForcedStop in the worker unless it is inside kernelext's own code.

        Once per run: a forced stop the agent's code swallows is raised again by kernelext
        at its next call (``enforce_stop``), never raised asynchronously a second time.
        """
        with self._guard_lock:
            if self._guard or self.thread_id is None or self._force_spent:
                return False
            self._force_fired = self._force_spent = True
            self.forced = True
            self.force_raised_at = time.monotonic()
            return _set_async_exc(self.thread_id, ForcedStop)

    @property
    def overrunning_after_force(self) -> float | None:
        """Seconds since a forced stop was raised into a step that still runs, else None.

        The exception lands at the next bytecode boundary: a call blocked in C (a sleep,
        a socket read without timeout, a lock) keeps the step running until it returns.
        """
        raised = self.force_raised_at
        if raised is None or self.current is None or self.thread_id is None:
            return None
        return time.monotonic() - raised


def _let_pending_fire() -> None:
    """Run a few bytecodes so that a pending asynchronous exception is delivered now."""
    for _ in range(100):
        pass


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> bool:
    obj = ctypes.py_object(exc) if exc is not None else None
    count = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)
    return bool(count == 1)


class _StepContext:
    """Context manager behind ``run.step``; skips its body when already completed."""

    def __init__(self, run: Run, key: str, name: str) -> None:
        self.run = run
        self.key = key
        self.name = name
        self.skipped = False
        self._old_trace: Any = None

    def __enter__(self) -> _StepContext:
        if self.run.begin_step(self.key, self.name):
            return self
        # Completed before: skip the body (the same technique debuggers use to jump).
        self.skipped = True
        self._old_trace = sys.gettrace()
        frame = sys._getframe(1)
        sys.settrace(lambda *args: None)
        frame.f_trace = self._skip
        return self

    def _skip(self, frame: FrameType, event: str, arg: Any) -> Any:
        raise _SkipBody

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self.skipped:
            sys.settrace(self._old_trace)
            frame = sys._getframe(1)
            frame.f_trace = None
            return kind is _SkipBody
        if kind is None:
            self.run.finish_open_step()
        return False


def _step_key(value: Any) -> str:
    """What ``run.steps(key=...)`` returned, as the step key: a ``str`` or an ``int``
    (exactly); anything else (an object's ``str``, a float) is no stable identity."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    from ..errors import NameNotText

    raise NameNotText(
        f"run.steps(key=...) must return a str or an int for each item, not a "
        f"{type(value).__name__}; give each item a stable identity, e.g. "
        "run.steps(items, key=lambda i: i.id)."
    )
