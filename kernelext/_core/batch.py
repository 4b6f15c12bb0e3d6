"""``run.map``: a batch of items, each one step of the run, up to ``concurrency`` at once.

How items, keys, fsyncs and stops fit together:

1. **Keys never depend on scheduling.** Every item's step key is ``key(item)`` (default:
   its position), computed for all items before any runs; duplicates are refused then.
   An effect called inside an item is keyed under the item's step with the call ordinal
   counted within the item (``RunEngine.next_call`` reads the item from a context
   variable, ``ITEM``), so which item finished first changes no key.
2. **An item is one step.** It begins (journaled), runs ``fn(item)``, and completes with
   its return value stored (``item_complete``, the encoding effect results use); a resume
   returns stored values and runs only what did not complete. Items never snapshot
   ``run.state`` (the agent writes it, with the list ``run.map`` returns).
3. **Durability is shared.** Items completing at once append their records to the
   journal and share one ``fdatasync`` (the journal's group commit).
4. **Stops drain.** The dispatching thread (the agent's) starts no item once a stop is
   asked, an item failed, or an item suspended the run; items in flight run to their
   step's end. A forced stop (or an item past ``max_step_seconds`` after a stop) is raised
   into each item's thread through the item's own ``ForceGate``; a call cut short is
   ``unknown``. An item waiting for a person ends without holding up the others; the run
   suspends once nothing else can run, with every open request listed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._formatting import duration_text, step_label
from .._validate import check_callable
from ..errors import (
    ForcedStop,
    ItemFailed,
    KernelextError,
    NeedsDecision,
    OwnershipLost,
    StateNotWritable,
    StopRequested,
)
from ..status import Reason, StepStatus
from .canonical import Unencodable
from .context import reset_current_run, set_current_run
from .forced_stop import ForceGate
from .keys import load_result, stored_result
from .names import check_stored_name, step_key_of
from .secrets import scrub_text, scrubbed_excerpt
from .step_info import StepInfo

if TYPE_CHECKING:
    from .run_engine import RunEngine

__all__ = ["ITEM", "Batch", "ItemState", "current_item", "run_map"]

# The item the current thread (or asyncio task) executes, if any.
ITEM: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "kernelext_item", default=None
)
WAIT_TICK = 0.05  # how often the dispatching thread looks for a stop while items run
FORCE_RETRY = 0.01  # a forced stop refused inside kernelext's bookkeeping: tried again


def current_item(engine: RunEngine) -> StepInfo | None:
    """The ``run.map`` item of ``engine`` this thread (or task) executes, else None."""
    item = ITEM.get()
    if item is not None and item.batch is not None and item.batch.engine is engine:
        return item
    return None


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

    def __repr__(self) -> str:
        return f"<run.state, read-only inside item {self._key!r}: {self._state!r}>"

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise refused_state_write(self._key)

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse


def refused_state_write(key: str) -> StateNotWritable:
    return StateNotWritable(
        f"run.state is not written from inside a run.map item (item {key!r}): items run at "
        "once, so what they wrote would depend on which finished first, and a resume would "
        "not restore it. Return the value from the item instead: run.map returns the values "
        "in input order, and the agent writes run.state (run.state['ids'] = run.map(...))."
    )


class Batch:
    """One ``run.map`` call in progress: its items in flight and what they ended with."""

    def __init__(self, engine: RunEngine, name: str | None, total: int) -> None:
        self.engine = engine
        self.name = name
        self.total = total
        self.done = 0
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
            "done": self.done,
            "failed": self.failed,
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
            gate = info.force
            if gate is not None:
                gate.try_raise()

    def flight(self) -> list[StepInfo]:
        with self.lock:
            return list(self.in_flight.values())


def run_map(
    engine: RunEngine,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    key: Callable[[Any], Any] | None,
    concurrency: int,
    return_exceptions: bool,
    name: str | None,
) -> list[Any]:
    """``run.map`` (see ``Run.map``)."""
    check_callable("run.map(fn=...)", fn, what="the function to call for each item")
    if key is not None:
        check_callable("run.map(key=...)", key, what="a function that gives each item's key")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(
            f"run.map(concurrency=...) takes a whole number of items to run at once (>= 1), "
            f"not {type(concurrency).__name__} {concurrency!r}."
        )
    if concurrency < 1:
        raise ValueError(
            f"run.map(concurrency={concurrency}) would run no item: give a whole number >= 1 "
            "(1 runs the items one at a time)."
        )
    if not isinstance(return_exceptions, bool):
        raise TypeError(
            f"run.map(return_exceptions=...) takes True or False, not {return_exceptions!r}."
        )
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            "run.map(items=...) takes the items to go through (a list, a generator...), not "
            f"{type(items).__name__}."
        )
    if current_item(engine) is not None:
        raise KernelextError(
            "run.map cannot be called inside a run.map item: items are steps, and steps do "
            "not nest. Call run.map from the agent, or make the inner work part of the item."
        )
    values = list(items)
    keys, texts = _keys(values, key)
    _check_keys(engine, keys, texts, given=key is not None)
    engine.finish_open_step()
    engine.safe_point()  # a stop asked before the batch starts no item
    engine._seen.update(keys)
    results: list[Any] = [None] * len(values)
    done_before: list[int] = []
    todo: list[int] = []
    completed = engine.completed
    for i, k in enumerate(keys):
        (done_before if k in completed else todo).append(i)
    stored: list[tuple[int, str]] = []  # decoded once the batch ran (not before the 1st item)
    if done_before:
        found = engine.store.item_results(engine.id, [keys[i] for i in done_before])
        for i in done_before:
            text = found.get(keys[i])
            if text is None:
                raise KernelextError(
                    f"Step {keys[i]!r} of run {engine.id!r} completed before without a stored "
                    "value (a run.steps or run.step step with this key?), so run.map cannot "
                    "return it. Give run.map keys of its own (key=...)."
                )
            stored.append((i, text))
        del found
    batch = Batch(engine, name, len(values))
    batch.done = len(done_before)
    _count_total(engine, keys)
    engine.batch = batch
    engine.notify("batch", batch)
    try:
        _dispatch(engine, batch, fn, values, keys, todo, results, concurrency, return_exceptions)
    finally:
        engine.batch = None
        engine.notify("batch_end", batch)
    for i, text in stored:
        results[i] = load_result(text)
    return results


def _keys(values: list[Any], key: Callable[[Any], Any] | None) -> tuple[list[str], list[int]]:
    """Every item's step key, and the positions of those given as text (checked by
    ``_check_keys``; a key made from an int is digits, and only its length is checked)."""
    if key is None:
        return [str(i) for i in range(len(values))], []
    keys: list[str] = []
    texts: list[int] = []
    for i, item in enumerate(values):
        raw = key(item)
        k = step_key_of(raw, "run.map")
        keys.append(k)
        if type(raw) is not int or len(k) > 40:
            texts.append(i)
    return keys, texts


def _check_keys(engine: RunEngine, keys: list[str], texts: list[int], *, given: bool) -> None:
    hint = (
        "Give run.map(key=...) a function that returns a short printable text (or int) "
        "unique to each item."
    )
    for index in texts:
        check_stored_name(keys[index], "step key", hint=hint)
    if len(set(keys)) == len(keys) and engine._seen.isdisjoint(keys):
        return  # the usual case, found in C; otherwise the first key at fault is named
    first: dict[str, int] = {}
    for index, k in enumerate(keys):
        if k in first:
            raise ValueError(
                f"run.map: items {first[k]} and {index} have the same key {k!r}. Each item is "
                "one step of the run and its key must be unique: nothing ran. " + hint
            )
        first[k] = index
        if k in engine._seen:
            raise ValueError(
                f"run.map: the key {k!r} of item {index} is the key of a step this run already "
                "went through (step keys are unique within a run): nothing ran. "
                + (hint if given else "Pass key=... (the default key is the item's position).")
            )


def _count_total(engine: RunEngine, keys: list[str]) -> None:
    if engine.total_steps is not None:
        return
    batch_keys = set(keys)
    before = sum(1 for k in engine.completed if k not in batch_keys)
    engine.total_steps = total = before + len(keys)
    engine.store.write_async(
        lambda tx: engine.store.update_run_tx(tx, engine.id, total_steps=total)
    )
    engine.notify("total", total)


class _Ended:
    """What one item ended with."""

    __slots__ = ("error", "index", "kind", "value")

    def __init__(self, index: int, kind: str, value: Any = None, error: Any = None) -> None:
        self.index, self.kind, self.value, self.error = index, kind, value, error


def _dispatch(
    engine: RunEngine,
    batch: Batch,
    fn: Callable[[Any], Any],
    values: list[Any],
    keys: list[str],
    todo: list[int],
    results: list[Any],
    concurrency: int,
    return_exceptions: bool,
) -> None:
    if not todo:
        return
    ended = 0
    first_failure: _Ended | None = None
    decision: _Ended | None = None
    lost: _Ended | None = None
    halted = False  # an item stopped or suspended the run: start nothing more
    waiting: list[StepInfo] = []
    pending = iter(todo)
    flight: set[concurrent.futures.Future[_Ended]] = set()
    woken: queue.SimpleQueue[object] = queue.SimpleQueue()  # an item ended: look at flight
    forced: BaseException | None = None
    workers = min(concurrency, len(todo))
    pool = concurrent.futures.ThreadPoolExecutor(
        workers, thread_name_prefix=f"kernelext-item[{engine.id}]"
    )
    try:
        while True:
            starting = (
                forced is None
                and not halted
                and first_failure is None
                and decision is None
                and lost is None
                and not engine.stop_event.is_set()
                and engine.suspend_request is None
            )
            while starting and len(flight) < concurrency:
                index = next(pending, None)
                if index is None:
                    break
                info = _new_item(engine, batch, keys[index], index)
                context = contextvars.copy_context()
                future = pool.submit(context.run, _run_item, engine, batch, info, fn, values[index])
                future.add_done_callback(woken.put)
                flight.add(future)
            if not flight:
                break
            try:
                finished = _finished(flight, woken)
                if not engine.stop_event.is_set():
                    engine.poll_external_stop()
            except ForcedStop as exc:  # raised into the agent's thread: cancel the items
                forced = exc
                continue
            if forced is not None or engine.force.wanted:
                batch.force_all()
            for future in finished:
                flight.discard(future)
                end = future.result()
                ended += 1
                if end.kind == "done":
                    results[end.index] = end.value
                elif end.kind == "failed":
                    if return_exceptions:
                        results[end.index] = end.error
                    elif first_failure is None:
                        first_failure = end
                elif end.kind == "waiting":
                    waiting.append(end.value)
                elif end.kind == "decision":
                    decision = decision or end
                elif end.kind == "lost":
                    lost = lost or end
                elif end.kind == "stopped":
                    halted = True
                    if isinstance(end.error, ForcedStop):
                        forced = forced or end.error
    finally:
        pool.shutdown(wait=True)
    if lost is not None:
        raise lost.error
    if forced is not None or batch.forced:
        raise forced if forced is not None else ForcedStop("forced stop")
    if decision is not None:
        raise decision.error
    if first_failure is not None:
        k = keys[first_failure.index]
        error = first_failure.error
        raise ItemFailed(
            f"run.map: item {k!r} raised {type(error).__name__}: {scrub_text(str(error))}. No "
            "new item started after it; the items in flight finished. Fix the cause and "
            f"resume the run: only the items not completed run again (or pass "
            "return_exceptions=True to get the exception in the item's place).",
            key=k,
        ) from error
    if engine.suspend_request is not None:  # run.suspend(...) inside an item
        reason = engine.suspend_request[0]
        raise StopRequested(reason)
    if waiting:
        _suspend_for_people(engine, waiting)
    if ended < len(todo) or halted:  # a stop: the rest runs on resume
        engine.safe_point()
        engine._deliver(StopRequested)


def _finished(
    flight: set[concurrent.futures.Future[_Ended]], woken: queue.SimpleQueue[object]
) -> list[concurrent.futures.Future[_Ended]]:
    """The items of ``flight`` that ended, waiting up to ``WAIT_TICK`` for one. Each
    item's end wakes this through ``woken``, which is only a signal: the futures say what
    ended (so none is missed whenever a forced stop lands), and no waiter is installed on
    every future in flight at each turn, as ``concurrent.futures.wait`` does."""
    try:
        woken.get(timeout=WAIT_TICK)
        while True:
            woken.get_nowait()
    except queue.Empty:
        pass
    return [future for future in flight if future.done()]


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


def _new_item(engine: RunEngine, batch: Batch, key: str, index: int) -> StepInfo:
    ordinal = engine.claim_ordinal(key)
    assert ordinal is not None  # only items not completed are started
    info = StepInfo(uuid.uuid4(), key, ordinal, batch.name)
    info.batch = batch
    info.index = index
    return info


def _run_item(
    engine: RunEngine, batch: Batch, info: StepInfo, fn: Callable[[Any], Any], item: Any
) -> _Ended:
    """One item in a pool thread: begin its step, call ``fn``, store its value."""
    gate = ForceGate(lambda swallowed_at: None)
    gate.thread_id = threading.get_ident()
    info.force = gate
    info.started = time.monotonic()
    token = ITEM.set(info)
    run_token = set_current_run(engine)
    with batch.lock:
        batch.in_flight[info.key] = info
    begun = finished = False
    value: Any = None
    outcome: BaseException | None = None
    try:
        try:
            with gate.critical():
                engine.store.begin_step(engine.id, info.id, info.ordinal, info.key, info.name)
                begun = True
            engine.notify("step", info)
            value = fn(item)
            finished = True
        except BaseException as exc:
            outcome = exc
        while True:  # absorb a forced stop that lands after the item returned
            try:
                gate.seal()
                break
            except StopRequested as late:
                if not finished and outcome is None:
                    outcome = late
        return _record_end(engine, batch, info, begun, finished, value, outcome)
    finally:
        gate.thread_id = None
        with batch.lock:
            batch.in_flight.pop(info.key, None)
        reset_current_run(run_token)
        ITEM.reset(token)


def _record_end(
    engine: RunEngine,
    batch: Batch,
    info: StepInfo,
    begun: bool,
    finished: bool,
    value: Any,
    outcome: BaseException | None,
) -> _Ended:
    index = info.index
    store = engine.store
    try:
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
                engine.forget_item_effects(info)
                engine.completed[info.key] = info.ordinal
                with batch.lock:
                    batch.done += 1
                    batch.durations.append(info.elapsed)
                engine.last_completed = info
                engine.notify(StepStatus.COMPLETED, info)
                return _Ended(index, "done", value)
        assert outcome is not None
        if isinstance(outcome, OwnershipLost):
            return _Ended(index, "lost", error=outcome)
        if isinstance(outcome, StopRequested):
            forced = isinstance(outcome, ForcedStop)
            if begun:
                why = (
                    "forced stop"
                    if forced
                    else ("waits for a person" if info.waiting else "stopped")
                )
                store.end_step(
                    engine.id, info.id, StepStatus.CANCELLED, error=why, forced=forced,
                    duration_s=info.elapsed,
                )  # fmt: skip
            if info.waiting is not None:
                with batch.lock:
                    batch.waiting += 1
                return _Ended(index, "waiting", info)
            return _Ended(index, "stopped", error=outcome)
        text = scrub_text(f"{type(outcome).__name__}: {outcome}")
        if begun:
            store.end_step(
                engine.id, info.id, StepStatus.FAILED, error=scrubbed_excerpt(text, 2000),
                duration_s=info.elapsed,
            )  # fmt: skip
        if isinstance(outcome, NeedsDecision):
            return _Ended(index, "decision", error=outcome)
        with batch.lock:
            batch.failed += 1
        engine.notify("item_failed", (info, outcome))
        return _Ended(index, "failed", error=outcome)
    except OwnershipLost as exc:
        return _Ended(index, "lost", error=exc)


def drain_text(batch: Batch) -> str:
    """``stopping: 12 items in flight, about 3 s`` (the drain of a stopped batch)."""
    counts = batch.snapshot()
    flying = counts["in_flight"]
    text = f"stopping: {flying} item{'s' if flying != 1 else ''} in flight"
    if counts["drain_s"] is not None and flying:
        text += f", about {duration_text(max(counts['drain_s'], 0.1))}"
    return text


def overran_text(info: StepInfo, limit: float) -> str:
    return f"{step_label(info.ordinal, info.key)} passed max_step_seconds ({duration_text(limit)})"
