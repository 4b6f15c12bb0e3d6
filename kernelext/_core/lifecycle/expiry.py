"""The sweeper: expire suspended runs past their deadline, then drop old payloads.

``kx.sweep(now=None)`` moves every suspended run whose deadline has passed to
``expired`` (reason ``deadline:<suspend reason>``), releases its claims and tells
whoever waits: an ``expired`` event row, the callbacks registered with
``kx.on_expire``, the run's listeners (open panels) and the runtime's end hooks. Each run is
expired in one transaction that re-checks its status, so two sweeps, or a sweep and
a resume, have exactly one winner.

Callbacks get every expiry **at least once**. The expiry is committed first (status,
event naming the sweeping process, claims), then this process's callbacks run, then
``runs.expiry_notified_at`` is set. A sweep in a process with callbacks registered (the
kernel's periodic sweeper, a ``kx.sweep()``) also delivers the expirations that no
process marked, however old: one whose sweep was killed between the commit and the mark,
or a ``kernelext sweep`` from cron, which has no callbacks and leaves them for a process
that has. It delivers one at once when the process that expired the run is gone (on this
host, its PID is not alive), otherwise ``LATE_AFTER_SECONDS`` (60 s) after the expiry
(the sweep that made it marks it within moments). Migration 7 marks the expirations made
before it as delivered: no callback was waiting for them.

A callback may see a run twice: when its process dies after calling it and before the
mark, the next sweep calls it again, so make callbacks idempotent (key them by
``run_id``). Two sweeps of one process never both deliver one expiry; sweeps of several
processes take turns on PostgreSQL (one advisory lock), while on DuckDB two processes
sweeping at the same moment could both deliver a late one, each to its own callbacks.
A callback that raises anything (also ``SystemExit``) is recorded
(``expire_callback_failed``) and counts as delivered: it is not called again for that
run, and the sweep and the periodic sweeper go on; only a ``KeyboardInterrupt`` in the
main thread (Ctrl-C on a ``kx.sweep()``) is let through, after the delivery is marked.

An expired run keeps its snapshots for ``retention_seconds``
(``kx.configure(retention_seconds=...)``) so that it can be restarted with
``kx.restart``. After that the sweeper removes the payloads and writes a
``snapshots_removed`` event; the run row, its steps and its ledger stay.

:class:`Sweeper` runs ``sweep`` periodically in a daemon thread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..._formatting import moment_text
from ..._shown import shows
from ..._store import Store
from ..._store.expiry import Expiry, PayloadRemoval
from ..._validate import FUNCTION, SOURCE, STORE, check_datetime, optional, validated
from ...status import Status
from ..encoding.secrets import scrubbed_excerpt
from ..process.lease import owner_alive
from ..process.runtime import get_store, runtime
from .run import engine_of

__all__ = [
    "ExpiredRun",
    "SweepResult",
    "Sweeper",
    "expiry_info",
    "on_expire",
    "remove_on_expire",
    "sweep",
]


class ExpiredRun(NamedTuple):
    """What an ``on_expire`` callback receives."""

    run_id: str
    reason: str  # "deadline:<suspend reason>"
    deadline: dt.datetime  # UTC, naive
    suspend_reason: str


@dataclass
class SweepResult:
    """What one sweep did."""

    now: dt.datetime
    expired: list[ExpiredRun] = field(default_factory=list)
    removed: list[PayloadRemoval] = field(default_factory=list)
    # Expired earlier (by a sweep that died before its callbacks ran, or one without
    # callbacks), delivered to this process's callbacks by this sweep.
    delivered: list[ExpiredRun] = field(default_factory=list)
    callback_errors: list[tuple[str, str]] = field(default_factory=list)  # (run id, error)
    busy: bool = False  # another process was sweeping this store; it did the work

    @property
    def expired_ids(self) -> list[str]:
        return [e.run_id for e in self.expired]

    @property
    def delivered_ids(self) -> list[str]:
        return [e.run_id for e in self.delivered]

    @property
    def removed_ids(self) -> list[str]:
        return [r.run_id for r in self.removed]

    @shows
    def text(self) -> str:
        lines = [
            f"sweep at {moment_text(self.now)}: {len(self.expired)} run(s) "
            f"expired, payloads of {len(self.removed)} run(s) removed"
        ]
        if self.busy:
            lines = [
                f"sweep at {moment_text(self.now)}: another process is sweeping "
                "this store right now; it does the work"
            ]
        lines += [
            f"  expired {e.run_id} ({e.reason}, deadline {moment_text(e.deadline)})"
            for e in self.expired
        ]
        lines += [
            f"  delivered the earlier expiry of {e.run_id} ({e.reason})" for e in self.delivered
        ]
        lines += [
            f"  removed {r.snapshots} snapshot(s), {r.blobs} payload(s) of {r.run_id}"
            for r in self.removed
        ]
        lines += [
            f"  on_expire callback failed for {rid}: {err}" for rid, err in self.callback_errors
        ]
        return "\n".join(lines)

    @shows
    def __repr__(self) -> str:
        return self.text()


SWEEP_LOCK = "kernelext:sweep"  # the advisory lock that makes one sweeper act at a time
# An expiry still not marked delivered this long after it was committed is delivered by
# the next sweep with callbacks; the sweep that made it marks it within moments. When the
# process that made it is known to be gone (same host, PID not alive), at once.
LATE_AFTER_SECONDS = 60.0
_DELIVERING: set[str] = set()  # run ids whose expiry a sweep of this process delivers now
_DELIVERING_LOCK = threading.Lock()
ExpireCallback = Callable[[ExpiredRun], Any]


@validated("kx.on_expire", callback=FUNCTION)
def on_expire(callback: ExpireCallback) -> ExpireCallback:
    """Call ``callback(expired_run)`` for every run that expires (at least once).

    A sweep in this process calls it for the runs it expires, and for runs expired
    earlier whose expiry no process delivered yet (see the module doc); a run may be
    seen twice if a process dies between calling and recording the delivery.

    ``expired_run`` has ``run_id``, ``reason``, ``deadline`` and ``suspend_reason``.
    Usable as a decorator; a callback that raises is recorded as an
    ``expire_callback_failed`` event and never stops the sweep. A callback stays
    registered for the life of the process (registering it again does nothing).
    """
    if not callable(callback):
        raise TypeError(f"kx.on_expire() takes a callable, not {callback!r}.")
    rt = runtime()
    with rt.lock:
        if callback not in rt.expire_callbacks:
            rt.expire_callbacks.append(callback)
    return callback


def remove_on_expire(callback: ExpireCallback) -> None:
    """Stop calling ``callback`` (registered with ``kx.on_expire``) on expiry."""
    rt = runtime()
    with rt.lock:
        if callback in rt.expire_callbacks:
            rt.expire_callbacks.remove(callback)


def _utc_naive(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value


@validated("kx.sweep", now=optional(check_datetime), store=STORE, source=SOURCE)
def sweep(
    now: dt.datetime | None = None, *, store: Store | None = None, source: str = "api"
) -> SweepResult:
    """Expire suspended runs past their deadline; remove payloads past retention.

    One sweeper acts at a time per store (on PostgreSQL an advisory lock shared by
    every process and host); a sweep that finds another one at work returns at once
    with ``busy=True``.
    """
    store = get_store(store)
    with store.try_advisory_lock(SWEEP_LOCK) as mine:
        if not mine:
            return SweepResult(_utc_naive(now) if now is not None else store.now(), busy=True)
        return _sweep(now, store, source)


def _sweep(now: dt.datetime | None, store: Store, source: str) -> SweepResult:
    at = _utc_naive(now) if now is not None else store.now()
    result = SweepResult(at)
    rt = runtime()
    retention = float(rt.settings.retention_seconds)
    for run_id in store.due_for_expiry(at):
        expiry = store.write(
            functools.partial(_expire_tx, store, run_id=run_id, now=at, source=source)
        )
        if expiry is not None:
            info = _info(expiry)
            result.expired.append(info)
            with _delivering(info.run_id):  # this sweep made the expiry: it delivers it
                _notify(store, info, result)
    _deliver_late(store, at, result)
    cutoff = at - dt.timedelta(seconds=retention)
    for run_id in store.retention_due(cutoff):
        removal = store.remove_payloads(run_id, at, retention_seconds=retention, source=source)
        if removal is not None:
            result.removed.append(removal)
    return result


def _info(expiry: Expiry) -> ExpiredRun:
    return ExpiredRun(
        expiry.run_id, f"deadline:{expiry.suspend_reason}", expiry.deadline, expiry.suspend_reason
    )


def _deliver_late(store: Store, at: dt.datetime, result: SweepResult) -> None:
    """Expirations no process delivered to its callbacks yet (the sweep that expired them
    died first, or had no callbacks), however old: this process's callbacks get them now,
    at once when the process that expired the run is gone (``owner_alive``), otherwise
    once ``LATE_AFTER_SECONDS`` passed since the expiry. A process without callbacks
    leaves them for one that has."""
    rt = runtime()
    with rt.lock:
        if not rt.expire_callbacks:
            return
    fresh = {e.run_id for e in result.expired}
    before = at - dt.timedelta(seconds=LATE_AFTER_SECONDS)
    for expiry in store.undelivered_expiries():
        if expiry.run_id in fresh:
            continue
        gone = owner_alive(expiry.expired_by) is False
        if not gone and expiry.expired_at is not None and expiry.expired_at > before:
            continue  # its sweep may still be delivering it
        with _delivering(expiry.run_id) as mine:
            # Another sweep of this process may have delivered and marked it meanwhile.
            if mine and not store.expiry_delivered(expiry.run_id):
                info = _info(expiry)
                result.delivered.append(info)
                _notify(store, info, result, late=True)


@contextlib.contextmanager
def _delivering(run_id: str) -> Iterator[bool]:
    """Whether this thread delivers ``run_id`` now: False while another sweep of this
    process delivers it (threads sweeping a DuckDB store do not exclude each other)."""
    with _DELIVERING_LOCK:
        mine = run_id not in _DELIVERING
        _DELIVERING.add(run_id)
    try:
        yield mine
    finally:
        if mine:
            with _DELIVERING_LOCK:
                _DELIVERING.discard(run_id)


def _expire_tx(
    store: Store, tx: Any, *, run_id: str, now: dt.datetime, source: str
) -> Expiry | None:
    expiry = store.expire_tx(tx, run_id, now, source=source)
    if expiry is not None:
        store.release_run_claims_tx(tx, run_id, Status.EXPIRED, source=source)
    return expiry


def _notify(store: Store, info: ExpiredRun, result: SweepResult, *, late: bool = False) -> None:
    """Tell this process: an open panel, the end hooks (for an expiry this sweep made),
    then the ``kx.on_expire`` callbacks; once they ran, ``expiry_notified_at`` records the
    delivery (a crash before that delivers it again: at least once)."""
    rt = runtime()
    with rt.live_lock:
        handle = rt.handles.get(info.run_id)
    if handle is not None:  # an open panel listens to its run
        engine_of(handle.run).notify(Status.EXPIRED, info)
    if not late:
        rt.run_ended(info.run_id, Status.EXPIRED)  # a broken hook must not break the sweep
    with rt.lock:
        callbacks = list(rt.expire_callbacks)
    if not callbacks:  # left for a process that has callbacks (see _deliver_late)
        return
    interrupted: BaseException | None = None
    for callback in callbacks:
        try:
            callback(info)
        except BaseException as exc:  # recorded, never breaks the sweep; not called again
            if isinstance(exc, KeyboardInterrupt) and _in_main_thread():
                interrupted = exc  # Ctrl-C on a kx.sweep(): recorded, then let through
            name = getattr(callback, "__qualname__", repr(callback))
            error = scrubbed_excerpt(f"{type(exc).__name__}: {exc}", 1000)
            result.callback_errors.append((info.run_id, error))
            with contextlib.suppress(Exception):  # the failure is in result.callback_errors
                store.record_event(
                    info.run_id,
                    "expire_callback_failed",
                    source="sweeper",
                    reason=f"{name}: {error}",
                    detail={"callback": name},
                )
            if interrupted is not None:
                break
    try:
        store.mark_expiry_notified([info.run_id], store.now())
    except Exception as exc:  # not marked: the next sweep with callbacks delivers it again
        result.callback_errors.append(
            (info.run_id, scrubbed_excerpt(f"not marked delivered: {exc}", 1000))
        )
    if interrupted is not None:
        raise interrupted


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def expiry_info(run_id: str, *, store: Store | None = None) -> dict[str, Any]:
    """For panels: status, reason, deadline, expiry time, how long the snapshot is kept."""
    store = get_store(store)
    row = store.get_run(run_id)
    info: dict[str, Any] = {
        "run_id": run_id,
        "status": row["status"],
        "reason": row["reason"],
        "deadline": row["deadline"],
        "expired_at": None,
        "kept_until": None,
        "removed_at": None,
        "restarts": store.children(run_id),
    }
    if row["status"] == Status.EXPIRED:
        expired_at = store.expired_at(run_id)
        info["expired_at"] = expired_at
        if expired_at is not None:
            info["kept_until"] = expired_at + dt.timedelta(
                seconds=runtime().settings.retention_seconds
            )
        info["removed_at"] = store.snapshots_removed_at(run_id)
    return info


class Sweeper:
    """Sweep every ``interval_s`` seconds in a daemon thread (the kernel's sweeper).

    ``store=None`` sweeps the default store, looked up at each tick. Errors are kept
    in ``last_error`` and never stop the thread.
    """

    def __init__(
        self, interval_s: float = 60.0, *, store: Store | None = None, source: str = "sweeper"
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"Sweeper interval_s must be positive, not {interval_s!r}.")
        self.interval_s = float(interval_s)
        self.store = store
        self.source = source
        self.sweeps = 0
        self.last_result: SweepResult | None = None
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Sweeper:
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kernelext-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def sweep_once(self) -> SweepResult | None:
        try:
            self.last_result = sweep(store=self.store, source=self.source)
            self.last_error = None
        except BaseException as exc:  # e.g. the store was closed; try next tick (any error)
            self.last_error = exc
            if isinstance(exc, KeyboardInterrupt) and _in_main_thread():
                raise
            return None
        finally:
            self.sweeps += 1
        return self.last_result

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sweep_once()
            self._stop.wait(self.interval_s)
