"""Suspended runs expire: per-reason deadlines, the sweeper, claims, callbacks, retention.

Time is an injected clock (the store's ``clock`` and ``kx.sweep(now=...)``); no sleeps.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.clocks import T0, TickingClock, store_on_clock  # noqa: F401  (the fixture `store`)
from support.live import name as unique
from support.sweeps import concurrent_sweeps

import kernelext as kx
from kernelext._core.lifecycle import expiry
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.process.runtime import runtime
from kernelext._expiry_policy import DEFAULT_EXPIRY
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


@pytest.fixture
def clock() -> TickingClock:
    return TickingClock()


def events(store: Store, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in store.events(run_id) if e["kind"] == kind]


def suspending_agent(reason: str, deadline: Any = None) -> kx.Agent:
    """An agent that completes step 0, suspends with ``reason``, then finishes on resume."""

    @kx.agent(name=unique("suspender"))
    def suspender(run: kx.Run, claims: list[str]) -> str:
        for resource in claims:
            run.claim(resource)
        for i in run.steps(range(2)):
            run.state["seen"] = i
            if i == 0:
                run.suspend(reason, deadline=deadline, note="waiting")
        return "done"

    return suspender


def suspend_run(
    store: Store, reason: str, run_id: str, *, deadline: Any = None, claims: list[str] | None = None
) -> kx.Handle:
    handle = suspending_agent(reason, deadline).start(claims or [], run_id=run_id)
    assert handle.wait(WAIT) == "suspended"
    return handle


# -- deadlines --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "reason", ["user_stop", "approval", "rate_limit", "error", "other", "some_new_reason"]
)
def test_the_deadline_is_set_at_suspension_from_the_reason(
    store: Store, clock: TickingClock, reason: str
) -> None:
    run_id = unique("deadline")
    if reason == "user_stop":
        gate = threading.Event()

        @kx.agent(name=unique("stoppable"))
        def stoppable(run: kx.Run) -> None:
            for _ in run.steps(range(3)):
                gate.wait(WAIT)

        handle = stoppable.start(run_id=run_id)
        handle.stop()
        gate.set()
        assert handle.wait(WAIT) == "suspended"
    else:
        suspend_run(store, reason, run_id)
    expected = T0 + DEFAULT_EXPIRY.get(reason, DEFAULT_EXPIRY["other"])
    row = store.get_run(run_id)
    assert (row["status"], row["reason"], row["deadline"]) == ("suspended", reason, expected)
    [event] = [e for e in store.events(run_id) if e["to_status"] == "suspended"]
    assert event["reason"] == reason
    assert json.loads(event["detail"])["deadline"] == expected.isoformat()

    # One second before the deadline nothing happens; at the deadline the run expires.
    assert kx.sweep(now=expected - dt.timedelta(seconds=1)).expired == []
    assert store.get_run(run_id)["status"] == "suspended"
    result = kx.sweep(now=expected)
    assert result.expired_ids == [run_id]
    row = store.get_run(run_id)
    assert (row["status"], row["reason"]) == ("expired", f"deadline:{reason}")
    [expired] = events(store, run_id, "expired")
    assert (expired["from_status"], expired["to_status"]) == ("suspended", "expired")
    assert json.loads(expired["detail"])["suspend_reason"] == reason


@pytest.mark.duckdb_only
def test_configured_policy_and_a_per_call_override(store: Store, clock: TickingClock) -> None:
    kx.configure(expiry={"approval": 90, "rate_limit": dt.timedelta(minutes=5)})
    suspend_run(store, "approval", "configured")
    assert store.get_run("configured")["deadline"] == T0 + dt.timedelta(seconds=90)
    suspend_run(store, "rate_limit", "configured-2")
    assert store.get_run("configured-2")["deadline"] == T0 + dt.timedelta(minutes=5)

    suspend_run(store, "approval", "override-delta", deadline=dt.timedelta(hours=2))
    assert store.get_run("override-delta")["deadline"] == T0 + dt.timedelta(hours=2)
    absolute = dt.datetime(2031, 6, 1, 9, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    suspend_run(store, "approval", "override-at", deadline=absolute)
    assert store.get_run("override-at")["deadline"] == dt.datetime(2031, 6, 1, 7, 30)

    result = kx.sweep(now=T0 + dt.timedelta(minutes=10))
    assert sorted(result.expired_ids) == ["configured", "configured-2"]
    assert {store.get_run(r)["status"] for r in ("override-delta", "override-at")} == {"suspended"}


@pytest.mark.duckdb_only
def test_bad_expiry_configuration_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        kx.configure(expiry={"approval": -5})


PRICES = {"A": 1.0}


def price_of(sku: str) -> float:
    return PRICES[sku]


@pytest.mark.duckdb_only
def test_a_run_waiting_for_a_decision_expires_too(store: Store, clock: TickingClock) -> None:
    """needs_decision is a pause: it gets a deadline from the ``decision`` policy."""
    PRICES["A"] = 1.0
    run_id = unique("undecided")

    @kx.agent(name=unique("pricer"))
    def pricer(run: kx.Run) -> None:
        run.claim("budget:A")
        for i in run.steps(range(2)):
            if i == 0:
                run.fact("price:A", price_of("A"), check=price_of, args=("A",))
                run.suspend("approval")

    assert pricer.start(run_id=run_id).wait(WAIT) == "suspended"
    PRICES["A"] = 2.0  # the world moved on
    waiting_since = clock.advance(hours=1)
    assert kx.resume(run_id).status == "needs_decision"
    deadline = waiting_since + DEFAULT_EXPIRY["decision"]
    row = store.get_run(run_id)
    assert (row["status"], row["deadline"]) == ("needs_decision", deadline)

    assert kx.sweep(now=deadline - dt.timedelta(seconds=1)).expired == []
    result = kx.sweep(now=deadline)
    assert result.expired_ids == [run_id] and result.expired[0].suspend_reason == "decision"
    row = store.get_run(run_id)
    assert (row["status"], row["reason"]) == ("expired", "deadline:decision")
    [expired] = events(store, run_id, "expired")
    assert expired["from_status"] == "needs_decision"
    assert [c["release_reason"] for c in store.claims(run_id)] == ["expired"]
    with pytest.raises(kx.RunStateError, match=r"kx\.restart"):
        kx.resume(run_id)


# -- claims on expiry ---------------------------------------------------------------------
def test_expiry_releases_both_claims_so_another_run_can_take_them(
    store: Store, clock: TickingClock
) -> None:
    suspend_run(store, "approval", "holder", claims=["customer:42", "gpu:0"])
    assert {c["resource"] for c in store.claims("holder", active=True)} == {"customer:42", "gpu:0"}

    @kx.agent(name=unique("taker"))
    def taker(run: kx.Run) -> list[str]:
        run.claim("customer:42")
        run.claim("gpu:0", amount=1)
        return [c["resource"] for c in engine_of(run).store.claims(run.id, active=True)]

    blocked = taker.start(run_id="taker-early")
    assert blocked.wait(WAIT) == "failed"
    assert isinstance(blocked.error, kx.ClaimConflict)
    assert "'holder'" in str(blocked.error) and "since 2031-05-01 12:00:00 UTC" in str(
        blocked.error
    )

    clock.advance(days=3)
    result = kx.sweep()
    assert result.expired_ids == ["holder"]
    released = store.claims("holder")
    assert [(c["release_reason"], c["released_at"]) for c in released] == [
        ("expired", clock.now),
        ("expired", clock.now),
    ]
    assert sorted(
        json.loads(e["detail"])["resource"] for e in events(store, "holder", "claim_released")
    ) == ["customer:42", "gpu:0"]

    later = taker.start(run_id="taker-late")
    assert later.wait(WAIT) == "completed"
    assert sorted(later.result) == ["customer:42", "gpu:0"]
    assert all(c["release_reason"] == "completed" for c in store.claims("taker-late"))

    with pytest.raises(kx.RunStateError, match=r"kx\.restart\('holder'\)"):
        kx.resume("holder")


# -- notification ---------------------------------------------------------------------------
@pytest.mark.duckdb_only
def test_callbacks_listeners_and_hooks_are_told_and_a_failing_callback_is_recorded(
    store: Store, clock: TickingClock
) -> None:
    handle = suspend_run(store, "rate_limit", "notified-1")
    suspend_run(store, "rate_limit", "notified-2")
    seen: list[expiry.ExpiredRun] = []
    panel: list[tuple[str, Any]] = []
    hooked: list[tuple[str, str]] = []

    def broken(info: expiry.ExpiredRun) -> None:
        raise RuntimeError(f"pager offline for {info.run_id}")

    def remember(info: expiry.ExpiredRun) -> None:
        seen.append(info)

    kx.on_expire(broken)
    assert kx.on_expire(remember) is remember
    kx.on_expire(remember)  # registering twice calls it once
    engine_of(handle.run).listeners.append(lambda what, value: panel.append((what, value)))
    runtime().end_hooks.append(lambda run_id, status: hooked.append((run_id, status)))
    try:
        clock.advance(hours=1)
        result = kx.sweep()
    finally:
        expiry.remove_on_expire(broken)
        expiry.remove_on_expire(remember)
        runtime().end_hooks.pop()
    deadline = T0 + dt.timedelta(hours=1)
    assert sorted(seen) == [
        expiry.ExpiredRun("notified-1", "deadline:rate_limit", deadline, "rate_limit"),
        expiry.ExpiredRun("notified-2", "deadline:rate_limit", deadline, "rate_limit"),
    ]
    assert [what for what, _ in panel] == ["expired"]
    assert panel[0][1].run_id == "notified-1"
    assert sorted(hooked) == [("notified-1", "expired"), ("notified-2", "expired")]
    assert sorted(r for r, _ in result.callback_errors) == ["notified-1", "notified-2"]
    for run_id in ("notified-1", "notified-2"):
        [failed] = events(store, run_id, "expire_callback_failed")
        assert "pager offline" in failed["reason"] and "broken" in failed["reason"]
        assert store.get_run(run_id)["status"] == "expired"
    assert "2 run(s) expired" in result.text()


@pytest.mark.duckdb_only
def test_a_failing_callbacks_error_is_scrubbed_before_it_is_cut(
    store: Store, clock: TickingClock
) -> None:
    secret = kx.secrets.register(f"EXPsecret-{uuid.uuid4().hex}")
    suspend_run(store, "rate_limit", "cut-1")

    def broken(info: expiry.ExpiredRun) -> None:  # the secret straddles character 1000
        raise RuntimeError("x" * (1000 - len("RuntimeError: ") - 11) + " " + secret)

    kx.on_expire(broken)
    try:
        clock.advance(hours=1)
        result = kx.sweep()
        [(_, error)] = result.callback_errors
        [failed] = events(store, "cut-1", "expire_callback_failed")
    finally:
        expiry.remove_on_expire(broken)
        kx.secrets.forget(secret)
    for text in (error, failed["reason"]):
        assert secret[:10] not in text and text.endswith("***")


@pytest.mark.duckdb_only
def test_on_expire_takes_only_callables(store: Store) -> None:
    with pytest.raises(TypeError, match="callable"):
        kx.on_expire("not a function")  # type: ignore[arg-type]


# -- races -------------------------------------------------------------------------------------
def test_two_sweeps_produce_exactly_one_expiry(store: Store, clock: TickingClock) -> None:
    for i in range(5):
        suspend_run(store, "error", f"raced-{i}")
    calls: list[str] = []
    kx.on_expire(lambda info: calls.append(info.run_id))
    clock.advance(days=2)
    results = concurrent_sweeps(3)
    assert sorted(r for res in results for r in res.expired_ids) == [f"raced-{i}" for i in range(5)]
    assert sorted(calls) == [f"raced-{i}" for i in range(5)]
    for i in range(5):
        assert len(events(store, f"raced-{i}", "expired")) == 1
    assert kx.sweep().expired == []


def test_a_sweep_racing_a_resume_has_exactly_one_winner(store: Store, clock: TickingClock) -> None:
    agent = suspending_agent("rate_limit")
    outcomes: dict[str, int] = {"resumed": 0, "expired": 0}
    for i in range(30):
        run_id = f"race-{i}"
        first = agent.start([], run_id=run_id)
        assert first.wait(WAIT) == "suspended"
        clock.advance(hours=2)
        barrier = threading.Barrier(2)
        got: dict[str, Any] = {}

        def sweep_it(
            barrier: threading.Barrier = barrier,
            got: dict[str, Any] = got,
            head_start: bool = i % 2 == 1,
        ) -> None:
            barrier.wait(WAIT)
            if head_start:  # let the resume get further before the sweep reads
                kx.runs()
            got["sweep"] = kx.sweep()

        def resume_it(
            rid: str = run_id, barrier: threading.Barrier = barrier, got: dict[str, Any] = got
        ) -> None:
            barrier.wait(WAIT)
            try:
                got["handle"] = kx.resume(rid)
            except kx.RunStateError as exc:
                got["error"] = exc

        threads = [threading.Thread(target=sweep_it), threading.Thread(target=resume_it)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        swept = run_id in got["sweep"].expired_ids
        resumed = "handle" in got
        assert swept != resumed, f"iteration {i}: swept={swept} resumed={resumed}"
        if resumed:
            outcomes["resumed"] += 1
            status = got["handle"].wait(WAIT)
            assert status == "completed", got["handle"].error
            assert events(store, run_id, "expired") == []
        else:
            outcomes["expired"] += 1
            assert "kx.restart" in str(got["error"])
            assert store.get_run(run_id)["status"] == "expired"
            assert len(events(store, run_id, "expired")) == 1
            assert events(store, run_id, "resumed") == []
    assert sum(outcomes.values()) == 30


# -- retention ----------------------------------------------------------------------------------
@pytest.mark.duckdb_only
def test_payloads_are_kept_for_the_retention_period_then_removed(
    store: Store, clock: TickingClock, store_path: Path
) -> None:
    kx.configure(retention_seconds=3600)

    @kx.agent(name=unique("big"))
    def big(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            run.state["blob"] = bytes([i]) * (3 << 19)  # 1.5 MiB: stored in a side file
            run.state["small"] = {"i": i}
            if i == 1:
                run.suspend("approval")

    assert big.start(run_id="keeper").wait(WAIT) == "suspended"
    folder = store.blob_dir("keeper")
    assert len(os.listdir(folder)) == 2
    clock.advance(days=3)
    assert kx.sweep().expired_ids == ["keeper"]
    expired_at = clock.now
    info = expiry.expiry_info("keeper")
    assert info["expired_at"] == expired_at
    assert info["kept_until"] == expired_at + dt.timedelta(hours=1)

    clock.advance(seconds=3599)
    assert kx.sweep().removed == []
    assert store.latest_snapshot("keeper")["removed_at"] is None

    clock.advance(seconds=1)
    result = kx.sweep()
    assert result.removed_ids == ["keeper"]
    [removal] = result.removed
    assert (removal.snapshots, removal.files) == (2, 2)
    assert not os.path.exists(folder)
    assert store.read("SELECT count(*) FROM blobs WHERE run_id = 'keeper'") == [(0,)]
    snaps = store.read("SELECT removed_at FROM snapshots WHERE run_id = 'keeper'")
    assert snaps == [(clock.now,), (clock.now,)]
    [event] = events(store, "keeper", "snapshots_removed")
    assert json.loads(event["detail"])["retention_seconds"] == 3600
    assert event["reason"] == "retention period of 1 h ended"
    # The audit record stays.
    assert store.get_run("keeper")["status"] == "expired"
    assert len(store.completed_steps("keeper")) == 2
    assert expiry.expiry_info("keeper")["removed_at"] == clock.now
    with pytest.raises(kx.RunStateError, match=r"removed .* retention period"):
        kx.restart("keeper")
    # A second sweep has nothing left to do.
    assert kx.sweep().removed == []
    assert len(events(store, "keeper", "snapshots_removed")) == 1


@pytest.mark.duckdb_only
def test_the_sweeper_thread_sweeps_the_default_store(store: Store, clock: TickingClock) -> None:
    suspend_run(store, "rate_limit", "periodic")
    clock.advance(hours=2)
    swept = threading.Event()
    kx.on_expire(lambda info: swept.set())
    sweeper = expiry.Sweeper(interval_s=0.05).start()
    try:
        assert swept.wait(WAIT)
    finally:
        sweeper.stop()
    assert not sweeper.running
    assert sweeper.last_error is None and sweeper.sweeps >= 1
    assert store.get_run("periodic")["status"] == "expired"
    with pytest.raises(ValueError, match="positive"):
        expiry.Sweeper(interval_s=0)


def test_a_run_resumed_before_the_sweep_is_not_expired(store: Store, clock: TickingClock) -> None:
    suspend_run(store, "rate_limit", "resumed-first")
    clock.advance(hours=2)
    handle = kx.resume("resumed-first")
    assert kx.sweep().expired == []
    assert handle.wait(WAIT) == "completed"
    assert events(store, "resumed-first", "expired") == []
