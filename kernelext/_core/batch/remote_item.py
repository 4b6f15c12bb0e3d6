"""One ``run.map`` item in another process (a Dask worker, a process pool's child).

``execute_item`` is what the owner dispatches: it opens the run's store from the task's
URL (PostgreSQL, with the worker's own credentials: ``PGPASSWORD``, ``PGPASSFILE``, or
``KERNELEXT_STORE`` holding the full URL), holds the owner's ownership epoch for the run
(every write it makes is fenced with it, so a worker of a stale owner is refused), loads
the item's ledger rows and runs ``fn(item)`` exactly as an item runs in the owner's
process: effects are keyed (run, item step key, tool, call ordinal within the item), an
applied one is replayed, a new one recorded (intent before the call, outcome after).

The executor may run an attempt again (Dask does when a worker dies): an intent of the
item without an outcome then belongs to an attempt that is gone mid-call, so it becomes
``unknown`` (nobody knows whether the call happened) and the item waits for a decision
(``kx.reconcile``) instead of calling again. Every effect call and safe point reads the
run's row (one indexed read): a stop ends the item there, a take-over refuses it. The
item's completion (``steps.result``) is written here, fenced; a step the owner already
ended is never overwritten. While the attempt runs, its step's heartbeat is renewed
(``remote_heartbeat.py``): a take-over asks no probe for its calls while it lives.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..._shown import shows
from ..._store import Store, open_store
from ...errors import OwnershipLost, RemoteItemError, RunNotFound, StopRequested, StoreError
from ...status import LIVE, EffectStatus, StepStatus
from ..encoding.keys import stored_result
from ..engine.forced_stop import ForceGate
from ..engine.run_engine import RunEngine, chain_roots
from ..engine.step_info import StepInfo
from .core import Batch
from .heartbeat import HEARTBEAT
from .items import ItemRun
from .wire import RemoteOutcome, RemoteTask, dumps, error_to_wire, loads

__all__ = ["WorkerCall", "WorkerEngine", "execute_item", "worker_url"]

KEEP_STORES = 4  # stores a worker process keeps open (one per run and epoch it serves)
KEEP_FUNCTIONS = 16
LOST_MID_CALL = (
    "the attempt of this item that recorded the intent is gone mid-call (its process died "
    "and the executor ran the item again): nobody knows whether the call happened, so it "
    "is not made again; decide it with kx.reconcile"
)

_lock = threading.Lock()
_stores: collections.OrderedDict[tuple[str, str, int], Store] = collections.OrderedDict()
_in_use: collections.Counter[tuple[str, str, int]] = collections.Counter()  # attempts on each
_functions: collections.OrderedDict[str, Any] = collections.OrderedDict()


def execute_item(blob: bytes) -> bytes:
    """Run one item attempt (a pickled ``RemoteTask``); answers a pickled ``RemoteOutcome``."""
    task: RemoteTask = loads(blob)
    try:
        outcome = _attempt(task)
    except OwnershipLost as exc:  # a stale owner's item: nothing was written for it
        outcome = RemoteOutcome("lost", error=error_to_wire(exc))
    except Exception as exc:  # the store, or fn or the item that cannot be read here
        outcome = RemoteOutcome("raised", error=error_to_wire(exc))
    return dumps(outcome)


class WorkerCall:
    """What the owner submits: ``WorkerCall()(blob)`` runs one item attempt
    (``execute_item``) in the process the executor picked. It travels by reference (this
    module and its name), so owner and workers run the same kernelext."""

    def __call__(self, blob: bytes) -> bytes:
        return execute_item(blob)

    @shows
    def __repr__(self) -> str:
        return "kernelext.run_map_item"


def worker_url(url: str) -> str:
    """The URL a worker connects with: ``KERNELEXT_STORE`` when it names the same store
    (with the password the task never carries), else the task's (libpq then reads
    ``PGPASSWORD``, ``PGPASSFILE``, ...)."""
    from ..._store.postgres_backend import url_without_password

    given = os.environ.get("KERNELEXT_STORE", "")
    if not given.startswith(("postgresql://", "postgres://")):
        return url
    try:
        return given if url_without_password(given) == url else url
    except StoreError:  # not a connection string libpq reads: not the same store
        return url


@contextlib.contextmanager
def _store_for(task: RemoteTask) -> Iterator[Store]:
    """The run's store for one attempt: cached per (URL, run, epoch); a store is closed
    only when no attempt of this process uses it (its attempts' heartbeats go through it)."""
    if not task.url.startswith(("postgresql://", "postgres://")):
        raise StoreError(
            f"run.map items of run {task.run_id!r} run in other processes only with a "
            "PostgreSQL store; this task names another kind of store."
        )
    key = (task.url, task.run_id, task.epoch)
    with _lock:
        store = _stores.get(key)
        if store is not None and not store.closed:
            _stores.move_to_end(key)
            _in_use[key] += 1
        else:
            store = _open(task)
            _stores[key] = store
            _in_use[key] += 1
            _close_idle()
    try:
        yield store
    finally:
        with _lock:
            _in_use[key] -= 1
            if _in_use[key] <= 0:
                del _in_use[key]
            _close_idle()


def _close_idle() -> None:
    """Close the least recently used stores beyond ``KEEP_STORES`` that no attempt uses."""
    for key in list(_stores):
        if len(_stores) <= KEEP_STORES:
            return
        if not _in_use.get(key):
            _stores.pop(key).close()


def _open(task: RemoteTask) -> Store:
    try:
        store = open_store(worker_url(task.url))
    except Exception as exc:
        raise StoreError(
            f"A worker of run {task.run_id!r} could not open the run's store {task.url}: "
            f"{exc}. Workers connect with their own credentials: set PGPASSWORD (or "
            "PGPASSFILE, or KERNELEXT_STORE with the full URL) in the workers' "
            "environment."
        ) from exc
    store.hold_epoch(task.run_id, task.epoch)
    store.counts_items = False  # the owner counts the run's completed steps
    return store


def _function(task: RemoteTask) -> Any:
    digest = task.fn_digest
    with _lock:
        fn = _functions.get(digest)
        if fn is not None:
            _functions.move_to_end(digest)
            return fn
    fn = loads(task.fn_blob)
    with _lock:
        _functions[digest] = fn
        while len(_functions) > KEEP_FUNCTIONS:
            _functions.popitem(last=False)
    return fn


def _read(task: RemoteTask, what: str, load: Any) -> Any:
    """``load()``: fn or the item rebuilt here. A ``SystemExit`` or ``KeyboardInterrupt``
    its unpickling raises (a ``__setstate__``, an import that exits) is the item's failure,
    never the worker's: let out, it would end the worker process, and the executor would
    run the item again on the next worker, and end that one too."""
    try:
        return load()
    except Exception:
        raise
    except BaseException as exc:
        raise RemoteItemError(
            f"{what} of run {task.run_id!r} could not be rebuilt in the worker process: its "
            f"unpickling raised {type(exc).__name__}: {exc}. Send values that rebuild "
            "anywhere (plain data), or make the object inside fn"
        ) from exc


class WorkerEngine(RunEngine):
    """The run as one item attempt in a worker sees it: the owner's epoch, and a look at
    the run's row at every effect call and safe point (a stop ends the item there)."""

    one_process = False  # its calls are counted by no process that sees all of them

    def __init__(self, store: Store, task: RemoteTask) -> None:
        super().__init__(
            store,
            task.run_id,
            task.agent,
            max_step_seconds=task.max_step_seconds,
            key_scheme=task.key_scheme,
        )
        self.held = task.epoch
        chain_roots[self] = task.chain_root

    def check_live(self) -> None:
        """Refuse a stale owner's item; end the item at a stop (or once the run left
        ``running``/``stopping``: it suspended, failed or was cancelled meanwhile)."""
        row = self.store.run_liveness(self.id)
        if row is None:
            raise RunNotFound(f"Run {self.id!r} is not in the store any more.")
        status, epoch, stop_at, source = row
        if epoch != self.held:
            raise self.store.ownership_lost(self.id, self.held, "effect intent")
        if stop_at is not None or status not in LIVE:
            self.stop_source = self.stop_source or source or "stop"
            self._deliver(StopRequested)

    def enforce_stop(self, where: str) -> None:
        super().enforce_stop(where)
        self.check_live()

    def safe_point(self) -> None:
        self.enforce_stop("a safe point")


def _attempt(task: RemoteTask) -> RemoteOutcome:
    with _store_for(task) as store:
        engine = WorkerEngine(store, task)
        step = store.step_status(task.step_id)
        if step is None or step[0] != StepStatus.RUNNING:  # ended by the owner, or before
            return RemoteOutcome("ended", value=step)
        with HEARTBEAT.beating(store, task.run_id, task.step_id):
            return _run_item(task, store, engine)


def _run_item(task: RemoteTask, store: Store, engine: WorkerEngine) -> RemoteOutcome:
    fn = _read(task, "fn", lambda: _function(task))
    item = _read(task, f"item {task.key!r}", lambda: loads(task.item_blob))
    engine.effects = store.step_effects(task.run_id, task.key)
    if any(row["status"] == EffectStatus.PENDING for row in engine.effects.values()):
        for key in store.lost_intents_unknown(task.run_id, task.key, task.epoch, LOST_MID_CALL):
            engine.effects[key]["status"] = EffectStatus.UNKNOWN
    info = StepInfo(task.step_id, task.key, task.ordinal, task.name)
    batch = Batch(engine, task.name, 1)
    info.batch = batch
    gate = ForceGate(lambda swallowed_at: None)
    gate.thread_id = threading.get_ident()
    run = ItemRun(engine, batch, info, gate)
    run.begun = True  # the owner began the step before it dispatched the item
    try:
        try:
            engine.check_live()
            run.value = fn(item)
            run.finished = True
        except BaseException as exc:
            run.outcome = exc
        end = run.end()
    finally:
        gate.thread_id = None
        run.leave()
    elapsed = info.elapsed
    if end.kind == "done":
        encoded = stored_result(end.value)
        state = store.step_status(task.step_id)  # another attempt may have completed it first
        if state is not None and state[0] == StepStatus.COMPLETED and state[1] is not None:
            encoded = state[1]  # the value the step keeps is the one the owner returns
        elif state is not None and state[0] != StepStatus.COMPLETED:
            return RemoteOutcome("ended", value=state, elapsed=elapsed)  # ended meanwhile
        return RemoteOutcome("done", value=encoded, elapsed=elapsed)
    if end.kind == "waiting":
        return RemoteOutcome("waiting", value=info.waiting, elapsed=elapsed)
    return RemoteOutcome(end.kind, error=error_to_wire(end.error), elapsed=elapsed)
