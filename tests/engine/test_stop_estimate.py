"""The honest stop estimate: from the run's own step durations, on a fake clock and live."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.clocks import TickingClock
from support.live import name

import kernelext as kx
from kernelext._core.engine.stop_estimate import (
    estimate_from,
    estimate_stop,
    percentile,
)
from kernelext._core.lifecycle.run import engine_of
from kernelext._store import Store, open_store
from kernelext.status import Status

WAIT = 60.0
T0 = dt.datetime(2026, 3, 2, 9, 0, 0)


def write_steps(store: Store, clock: TickingClock, run_id: str, durations: list[float]) -> None:
    """Completed steps ``0..n-1`` of known durations, written through the store."""
    for ordinal, seconds in enumerate(durations):
        step_id = uuid.uuid4()
        store.begin_step(run_id, step_id, ordinal, f"item-{ordinal}", None)
        clock.advance(seconds=seconds)
        store.complete_step(run_id, step_id, ordinal, seconds, {}, [], 0)


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([4.0], 0.9) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile(range(1, 11), 0.9) == pytest.approx(9.1)
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_the_estimate_lies_within_the_runs_own_range() -> None:
    durations = [float(d) for d in range(1, 11)]  # median 5.5 s, 90th percentile 9.1 s
    est = estimate_from(durations, run_id="r", now=T0, step_ordinal=10, step_key="10", elapsed=2.0)
    assert (est.median_s, est.p90_s, est.samples) == (5.5, pytest.approx(9.1), 10)
    assert est.seconds_left == pytest.approx(3.5) and est.seconds_left_max == pytest.approx(7.1)
    assert min(durations) <= 2.0 + est.seconds_left <= 2.0 + est.seconds_left_max
    assert 2.0 + est.seconds_left_max <= max(durations)
    assert est.overrunning_by is None and est.forced_at is None
    assert est.text == "stops after step 11, in about 3.5 s (up to 7.1 s)"


def test_overrunning_and_the_forced_bound_are_said() -> None:
    durations = [1.0, 2.0, 3.0]
    est = estimate_from(
        durations, run_id="r", now=T0, step_ordinal=4, step_key="page-4", elapsed=12.0,
        max_step_seconds=30.0,
    )  # fmt: skip
    assert est.overrunning_by == pytest.approx(12.0 - percentile(durations, 0.9))
    assert est.forced_in == 18.0 and est.forced_at == T0 + dt.timedelta(seconds=18)
    assert est.text == (
        "stops after step 5 (page-4); overrunning by 9.2 s (its steps take about 2.0 s, "
        "90% within 2.8 s); max_step_seconds forces it in 18 s"
    )
    past = estimate_from(
        durations, run_id="r", now=T0, step_ordinal=4, step_key="4", elapsed=31.0,
        max_step_seconds=30.0,
    )  # fmt: skip
    assert past.forced_in == 0.0
    assert past.text.endswith(
        "max_step_seconds (30 s) has passed: the forced stop lands when the step returns to Python"
    )
    unbounded = estimate_from(
        durations, run_id="r", now=T0, step_ordinal=4, step_key="4", elapsed=9
    )
    assert unbounded.text.endswith(
        "no max_step_seconds bounds it (Force stop cancels the step now)"
    )
    # The bound caps the estimate: the monitor forces the stop then, whatever the median.
    capped = estimate_from(
        [10.0, 20.0], run_id="r", now=T0, step_ordinal=2, step_key="2", elapsed=1.0,
        max_step_seconds=5.0,
    )  # fmt: skip
    assert capped.seconds_left == capped.seconds_left_max == capped.forced_in == 4.0
    first = estimate_from([], run_id="r", now=T0, step_ordinal=0, step_key="0", elapsed=3.0)
    assert (
        first.text
        == "stops after step 1; no completed step to estimate from yet (this one has run 3.0 s)"
    )


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(
    st.lists(st.floats(0.0, 1e5), min_size=1, max_size=40),
    st.floats(0.0, 2e5),
    st.one_of(st.none(), st.floats(0.1, 1e5)),
)
def test_estimate_invariants(durations: list[float], elapsed: float, bound: float | None) -> None:
    est = estimate_from(
        durations, run_id="r", now=T0, step_ordinal=1, step_key="1", elapsed=elapsed,
        max_step_seconds=bound,
    )  # fmt: skip
    assert est.seconds_left is not None and est.seconds_left_max is not None
    assert 0.0 <= est.seconds_left <= est.seconds_left_max
    if bound is not None:
        assert est.forced_in is not None and est.seconds_left_max <= est.forced_in
    if est.overrunning_by is None:  # not past the estimate: it ends within the run's range
        assert elapsed + est.seconds_left_max <= max(durations) * (1 + 1e-9) + 1e-9
    else:
        assert elapsed > max(percentile(durations, 0.9), 0.0) and est.seconds_left_max == 0.0
    assert est.text.startswith("stops after step 2")  # ordinal 1: the second step


def test_estimate_from_steps_of_known_duration_in_the_store(store_path: Path) -> None:
    clock = TickingClock(T0)
    store = open_store(str(store_path), clock=clock)
    try:
        assert store.create_run("est-1", "estimating", max_step_seconds=60.0)
        write_steps(store, clock, "est-1", [2.0, 4.0, 6.0, 8.0, 10.0])
        store.begin_step("est-1", uuid.uuid4(), 5, "item-5", None)
        clock.advance(seconds=3.0)
        assert estimate_stop("est-1", store) is None  # no stop pending: nothing to estimate
        store.request_stop("est-1", source="cli")
        est = estimate_stop("est-1", store)
        assert est is not None
        assert (est.step_ordinal, est.step_key, est.elapsed_s, est.samples) == (5, "item-5", 3.0, 5)
        assert (est.median_s, est.p90_s) == (6.0, pytest.approx(9.2))
        assert 2.0 <= est.elapsed_s + est.seconds_left <= est.elapsed_s + est.seconds_left_max
        assert est.elapsed_s + est.seconds_left_max <= 10.0
        assert est.forced_at == clock.now + dt.timedelta(seconds=57)
        assert est.text == (
            "stops after step 6 (item-5), in about 3.0 s (up to 6.2 s); "
            "max_step_seconds forces it in 57 s"
        )
        clock.advance(seconds=9.0)  # 12 s into a step whose peers take 2..10 s
        late = estimate_stop("est-1", store)
        assert late is not None and late.overrunning_by == pytest.approx(2.8)
        assert late.text.startswith("stops after step 6 (item-5); overrunning by 2.8 s")
        assert late.text.endswith("max_step_seconds forces it in 48 s")
        assert late.as_dict()["text"] == late.text
    finally:
        store.close()


def test_a_live_run_estimates_its_own_pending_stop(store: Store) -> None:
    at_three, go = threading.Event(), threading.Event()

    @kx.agent(name=name("live-estimate"))
    def live(run: kx.Run) -> None:
        for i in run.steps(range(6)):
            if i == 3:
                kx.stop(run.id, source="self")
                at_three.set()
                assert go.wait(WAIT)

    handle = live.start(run_id="live-est")
    assert at_three.wait(WAIT)
    assert handle.status == Status.STOPPING
    # Exact: the step executing in this process; from the table: its running row.
    for current in (engine_of(handle.run).current, None):
        est: Any = estimate_stop("live-est", store, current=current)
        assert est is not None and (est.step_ordinal, est.samples) == (3, 3)
        assert est.max_step_seconds is None and est.forced_at is None
        assert est.text.startswith("stops after step 4")  # i == 3: the fourth step
    assert "; stops after step 4" in handle.status_text  # what the handle says
    shown = subprocess.run(
        [sys.executable, "-m", "kernelext", "show", "live-est", "--store", str(store.location)],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert "stops after step 4" in shown.stdout, shown.stderr  # and the command line
    go.set()
    assert handle.wait(WAIT) == Status.SUSPENDED
    assert estimate_stop("live-est", store) is None
    assert "stops after" not in handle.status_text
