"""``kx.on_expire`` callbacks get every expiry at least once (issue 19 item 7).

The expiry is committed first; ``runs.expiry_notified_at`` records that a process's
callbacks ran for it. A sweep killed in between leaves it unmarked, and the next sweep
of a process with callbacks delivers it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash import CRASH_DIR, WorkerPool, whole_lines
from support.clocks import TickingClock, store_on_clock  # noqa: F401  (the fixture `store`)
from support.old_schema import back_to_schema
from support.sweeps import concurrent_sweeps

import kernelext as kx
from kernelext._core.lifecycle import expiry
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, actor, open_store
from kernelext._store.compat import NEWEST_SCHEMA

pytestmark = pytest.mark.both_backends

WAIT = 60.0
LATE = dt.timedelta(seconds=expiry.LATE_AFTER_SECONDS + 1)


@pytest.fixture
def clock() -> TickingClock:
    return TickingClock(microseconds=100)


def suspend(run_id: str, store: Store | None = None, deadline: Any = None) -> None:
    @kx.agent(name=f"waiter-{uuid.uuid4().hex[:6]}")
    def waiter(run: kx.Run) -> None:
        with run.step("only"):
            run.suspend("rate_limit", deadline=deadline)

    assert waiter.start(run_id=run_id, store=store).wait(WAIT) == "suspended"


def notified_at(store: Store, run_id: str) -> Any:
    [(at,)] = store.read("SELECT expiry_notified_at FROM runs WHERE id = ?", (run_id,))
    return at


@pytest.fixture
def seen() -> Iterator[list[str]]:
    calls: list[str] = []

    def remember(info: expiry.ExpiredRun) -> None:
        calls.append(info.run_id)

    kx.on_expire(remember)
    yield calls
    expiry.remove_on_expire(remember)


# -- a sweep killed right after the expiry committed ----------------------------------------
@pytest.mark.crash
def test_a_sweep_killed_after_the_expiry_leaves_it_for_the_next_sweep(tmp_path: Path) -> None:
    path = tmp_path / "swept.duckdb"
    side_log = tmp_path / "paged.log"
    opened = open_store(str(path))
    runtime().settings.use_store(opened)
    pool = WorkerPool(CRASH_DIR / "sweep_worker.py", tmp_path)
    try:
        suspend("paged", opened, deadline=dt.timedelta(seconds=1))
        now = opened.now() + dt.timedelta(seconds=5)
        worker = pool.take()
        worker.go(store=str(path), side_log=str(side_log), now=now.isoformat())
        assert worker.reap() == -9, worker.stderr()  # killed inside its callback
        assert [m.group(0) for m in whole_lines(side_log, r"paged")] == ["paged"]
        row = opened.get_run("paged")
        assert (row["status"], row["reason"]) == ("expired", "deadline:rate_limit")
        assert [e for e in opened.events("paged") if e["kind"] == "expired"]
        assert not opened.expiry_delivered("paged")  # the delivery was never recorded

        calls: list[expiry.ExpiredRun] = []
        kx.on_expire(calls.append)
        # The sweeping process is gone (same host, its PID is not alive): the very next
        # sweep delivers, without waiting for LATE_AFTER_SECONDS.
        expired = next(e for e in opened.events("paged") if e["kind"] == "expired")
        assert expired["actor"] and expired["actor"] != actor()
        soon = kx.sweep(now + dt.timedelta(seconds=1))
        assert soon.expired == [] and soon.delivered_ids == ["paged"]
        assert calls == [
            expiry.ExpiredRun("paged", "deadline:rate_limit", row["deadline"], "rate_limit")
        ]
        assert "delivered the earlier expiry of paged" in soon.text()
        assert opened.expiry_delivered("paged")
        assert kx.sweep(now + 2 * LATE).delivered == []  # once marked, never again
        assert len(calls) == 1
    finally:
        pool.close()
        runtime().close()


# -- in one process ---------------------------------------------------------------------
def test_a_sweep_with_callbacks_marks_what_it_delivered(
    store: Store, clock: TickingClock, seen: list[str]
) -> None:
    suspend("marked")
    clock.advance(dt.timedelta(hours=2))
    assert kx.sweep().expired_ids == ["marked"]
    assert seen == ["marked"] and notified_at(store, "marked") is not None
    clock.advance(LATE)
    assert kx.sweep().delivered == [] and seen == ["marked"]


def test_a_sweep_without_callbacks_leaves_the_delivery_to_one_with_them(
    store: Store, clock: TickingClock
) -> None:
    suspend("cron")
    clock.advance(dt.timedelta(hours=2))
    assert kx.sweep().expired_ids == ["cron"]  # like `kernelext sweep` from cron
    assert notified_at(store, "cron") is None
    clock.advance(LATE)
    assert kx.sweep().delivered == []  # still nobody to tell
    calls: list[str] = []
    kx.on_expire(lambda info: calls.append(info.run_id))
    assert kx.sweep().delivered_ids == ["cron"]
    assert calls == ["cron"] and notified_at(store, "cron") is not None


def test_a_callback_that_raises_counts_as_delivered(store: Store, clock: TickingClock) -> None:
    calls: list[str] = []

    def broken(info: expiry.ExpiredRun) -> None:
        calls.append(info.run_id)
        raise RuntimeError("pager offline")

    suspend("broken")
    kx.on_expire(broken)
    clock.advance(dt.timedelta(hours=2))
    result = kx.sweep()
    assert [r for r, _ in result.callback_errors] == ["broken"]
    assert notified_at(store, "broken") is not None
    clock.advance(LATE)
    assert kx.sweep().delivered == [] and calls == ["broken"]  # not retried forever
    assert len([e for e in store.events("broken") if e["kind"] == "expire_callback_failed"]) == 1


def wait_for(predicate: Any, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_callback_raising_systemexit_never_stops_the_periodic_sweeper(
    store: Store, clock: TickingClock
) -> None:
    calls: list[str] = []

    def exits(info: expiry.ExpiredRun) -> None:
        calls.append(info.run_id)
        raise SystemExit(3)

    kx.on_expire(exits)
    suspend("exit1")
    clock.advance(dt.timedelta(hours=2))
    sweeper = expiry.Sweeper(0.05).start()
    try:
        wait_for(lambda: "exit1" in calls and store.expiry_delivered("exit1"))
        suspend("exit2")
        clock.advance(dt.timedelta(hours=2))
        wait_for(lambda: "exit2" in calls and store.expiry_delivered("exit2"))
        assert sweeper.running
    finally:
        sweeper.stop()
    assert calls == ["exit1", "exit2"]  # each once: recorded, counts as delivered
    failed = [e for e in store.events("exit1") if e["kind"] == "expire_callback_failed"]
    assert len(failed) == 1 and "SystemExit" in failed[0]["reason"]


def test_a_keyboard_interrupt_in_a_callback_of_kx_sweep_is_let_through(
    store: Store, clock: TickingClock
) -> None:
    def interrupted(info: expiry.ExpiredRun) -> None:
        raise KeyboardInterrupt

    kx.on_expire(interrupted)
    suspend("ctrlc")
    clock.advance(dt.timedelta(hours=2))
    with pytest.raises(KeyboardInterrupt):
        kx.sweep()
    assert store.get_run("ctrlc")["status"] == "expired"
    assert store.expiry_delivered("ctrlc")  # marked before it was let through


def test_two_sweeps_at_once_deliver_a_late_expiry_once(store: Store, clock: TickingClock) -> None:
    for i in range(4):
        suspend(f"late-{i}")
    clock.advance(dt.timedelta(hours=2))
    assert len(kx.sweep().expired) == 4  # no callbacks yet: all unmarked
    calls: list[str] = []
    slow = threading.Event()

    def pager(info: expiry.ExpiredRun) -> None:
        calls.append(info.run_id)
        slow.wait(0.05)  # long enough for the other sweeps to look meanwhile

    kx.on_expire(pager)
    clock.advance(LATE)
    results = concurrent_sweeps(3)
    assert sorted(calls) == [f"late-{i}" for i in range(4)]
    assert sorted(e.run_id for r in results for e in r.delivered) == sorted(calls)


def test_an_expiry_long_past_its_retention_is_still_delivered(
    store: Store, clock: TickingClock
) -> None:
    kx.configure(retention_seconds=3600)
    suspend("ancient")
    clock.advance(dt.timedelta(hours=2))
    assert kx.sweep().expired_ids == ["ancient"]  # like cron: no callbacks, left unmarked
    clock.advance(dt.timedelta(days=31))
    calls: list[str] = []
    kx.on_expire(lambda info: calls.append(info.run_id))
    result = kx.sweep()
    assert result.removed_ids == ["ancient"] and result.delivered_ids == ["ancient"]
    assert calls == ["ancient"] and store.expiry_delivered("ancient")
    assert kx.sweep().delivered == [] and calls == ["ancient"]


def test_expiries_from_before_schema_7_are_not_delivered_late(
    store: Store, clock: TickingClock, store_path: Path
) -> None:
    suspend("before7")
    clock.advance(dt.timedelta(hours=2))
    assert kx.sweep().expired_ids == ["before7"]
    assert not store.expiry_delivered("before7")
    # The store as it was at schema 6: migration 7 runs again when it is opened.
    back_to_schema(store, 6)
    runtime().close()
    reopened = open_store(str(store_path), clock=clock)
    runtime().settings.use_store(reopened)
    assert reopened.schema_version() == NEWEST_SCHEMA
    assert reopened.expiry_delivered("before7")  # no callback was waiting for it
    calls: list[str] = []
    kx.on_expire(lambda info: calls.append(info.run_id))
    clock.advance(dt.timedelta(hours=1))
    assert kx.sweep().delivered == [] and calls == []
