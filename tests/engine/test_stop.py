"""Stopping runs: safe points, stop storms, the BaseException signal, the step time bound."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.live import name, stall_after_each_force, wait_until

import kernelext as kx
from kernelext._core.engine.snapshot import Snapshotter
from kernelext._core.process.runtime import runtime
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


def events_of(store: Store, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in store.events(run_id) if kind is None or e["kind"] == kind]


@pytest.mark.duckdb_only
def test_stop_signal_is_a_base_exception() -> None:
    for signal in (kx.StopRequested, kx.ForcedStop):
        assert issubclass(signal, BaseException)
        assert not issubclass(signal, Exception)
    assert issubclass(kx.ForcedStop, kx.StopRequested)


def test_stop_at_a_safe_point_suspends_with_the_last_step_durable(
    store: Store, store_path: Path
) -> None:
    at_three, go = threading.Event(), threading.Event()

    @kx.agent(name=name("safe"))
    def safe(run: kx.Run) -> None:
        for i in run.steps(range(10)):
            run.state["done"] = [*run.state.get("done", []), i]
            if i == 3:
                at_three.set()
                go.wait(WAIT)

    handle = safe.start(run_id="safe-1")
    assert at_three.wait(WAIT)
    # The request is recorded at once, while the step is still running.
    assert handle.stop(source="button") == "stopping"
    row = store.get_run("safe-1")
    assert (row["status"], row["stop_source"]) == ("stopping", "button")
    assert row["stop_requested_at"] is not None
    go.set()
    assert handle.wait(WAIT) == "suspended"

    # Everything below is read back from the file after closing it.
    runtime().settings.close()
    reopened = kx.open_store(str(store_path))
    row = reopened.get_run("safe-1")
    assert (row["status"], row["reason"]) == ("suspended", "user_stop")
    assert row["deadline"] is not None and row["deadline"] > row["updated_at"]
    steps = reopened.steps("safe-1")
    # The step running at the request finished; the next one never began.
    assert [(s["key"], s["status"]) for s in steps] == [(str(i), "completed") for i in range(4)]
    snapshot = reopened.latest_snapshot("safe-1")
    assert snapshot is not None and snapshot["step_ordinal"] == 3
    state = Snapshotter("safe-1").restore(reopened, snapshot["manifest"])
    assert state == {"done": [0, 1, 2, 3]}
    (suspended,) = events_of(reopened, "safe-1", "suspended")
    assert (suspended["from_status"], suspended["to_status"]) == ("stopping", "suspended")
    assert (suspended["reason"], suspended["source"]) == ("user_stop", "button")
    assert '"last_step": "3"' in suspended["detail"]
    assert [e["kind"] for e in reopened.events("safe-1")] == [
        "created",
        "stop_requested",
        "suspended",
    ]


def test_stop_storm_makes_one_transition_and_records_every_request(store: Store) -> None:
    entered, go = threading.Event(), threading.Event()

    @kx.agent(name=name("storm"))
    def storm(run: kx.Run) -> None:
        for i in run.steps(range(5)):
            if i == 1:
                entered.set()
                go.wait(WAIT)

    handle = storm.start(run_id="storm-1")
    assert entered.wait(WAIT)
    threads, per_thread = 8, [13, 13, 13, 13, 12, 12, 12, 12]
    assert sum(per_thread) == 100
    start = threading.Barrier(threads)
    answers: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def press(index: int) -> None:
        try:
            start.wait(WAIT)
            for n in range(per_thread[index]):
                if n % 2:
                    answer = handle.stop(source=f"thread-{index}")
                else:
                    answer = kx.stop("storm-1", source=f"thread-{index}")
                with lock:
                    answers.append(answer)
        except BaseException as exc:
            errors.append(exc)

    pressers = [threading.Thread(target=press, args=(i,)) for i in range(threads)]
    for thread in pressers:
        thread.start()
    for thread in pressers:
        thread.join(WAIT)
    assert errors == []
    assert answers == ["stopping"] * 100
    stops = events_of(store, "storm-1", "stop_requested")
    assert len(stops) == 100
    moved = [e for e in store.events("storm-1") if e["to_status"] == "stopping"]
    assert len(moved) == 1
    assert sorted({e["source"] for e in stops}) == sorted(f"thread-{i}" for i in range(threads))
    go.set()
    assert handle.wait(WAIT) == "suspended"
    transitions = [
        (e["from_status"], e["to_status"])
        for e in store.events("storm-1")
        if e["to_status"] is not None
    ]
    assert transitions == [(None, "running"), ("running", "stopping"), ("stopping", "suspended")]


def test_except_exception_in_a_step_cannot_swallow_the_stop(store: Store) -> None:
    entered = threading.Event()
    swallowed: list[BaseException] = []

    @kx.agent(name=name("greedy"))
    def greedy(run: kx.Run) -> None:
        with run.step("poll"):
            entered.set()
            for _ in range(3000):  # bounded: ~30 s, then the run would complete
                try:
                    run.checkpoint()
                    time.sleep(0.01)
                except Exception as exc:
                    swallowed.append(exc)

    handle = greedy.start(run_id="greedy-1")
    assert entered.wait(WAIT)
    handle.stop()
    assert handle.wait(WAIT) == "suspended"
    assert swallowed == []
    (step,) = store.steps("greedy-1")
    assert (step["status"], step["forced"]) == ("cancelled", False)
    assert store.get_run("greedy-1")["reason"] == "user_stop"


def test_step_past_its_time_bound_with_a_stop_pending_is_forced(store: Store) -> None:
    entered = threading.Event()
    raised: list[type[BaseException]] = []
    ticks = [6000]  # bounded: ~60 s without a safe point; the resume needs only one
    bodies: list[str] = []

    @kx.agent(name=name("stuck"), max_step_seconds=0.3)
    def stuck(run: kx.Run) -> None:
        with run.step("first"):
            bodies.append("first")
            run.state["first"] = True
        with run.step("slow"):
            bodies.append("slow")
            entered.set()
            try:
                for _ in range(ticks[0]):
                    time.sleep(0.01)
            except BaseException as exc:
                raised.append(type(exc))
                raise
        with run.step("never"):
            run.state["never"] = True

    handle = stuck.start(run_id="stuck-1")
    assert entered.wait(WAIT)
    handle.stop(source="button")
    assert handle.wait(WAIT) == "suspended"
    assert raised == [kx.ForcedStop]
    steps = {s["key"]: s for s in store.steps("stuck-1")}
    assert set(steps) == {"first", "slow"}
    assert steps["first"]["status"] == "completed"
    assert (steps["slow"]["status"], steps["slow"]["forced"]) == ("cancelled", True)
    row = store.get_run("stuck-1")
    assert (row["status"], row["reason"]) == ("suspended", "user_stop")
    kinds = [e["kind"] for e in store.events("stuck-1")]
    assert "force_raised" in kinds
    (forced,) = events_of(store, "stuck-1", "stop_forced")
    assert (forced["from_status"], forced["to_status"]) == ("stopping", "suspended")
    assert '"forced": true' in forced["detail"]
    # The forced step runs again on resume; the completed one does not.
    ticks[0] = 1
    resumed = kx.resume("stuck-1")
    assert resumed.wait(WAIT) == "completed"
    assert bodies == ["first", "slow", "slow"]
    assert resumed.run.state == {"first": True, "never": True}


def test_overrun_without_a_stop_is_only_reported(store: Store) -> None:
    def overran() -> bool:
        return any(e["kind"] == "step_overran" for e in store.events("slow-1"))

    @kx.agent(name=name("slowpoke"), max_step_seconds=0.2)
    def slowpoke(run: kx.Run) -> None:
        with run.step("slow"):
            wait_until(overran, "the step_overran event")
            run.state["finished"] = True

    handle = slowpoke.start(run_id="slow-1")
    assert handle.wait(WAIT) == "completed"
    (step,) = store.steps("slow-1")
    assert (step["status"], step["forced"]) == ("completed", False)
    kinds = [e["kind"] for e in store.events("slow-1")]
    assert "force_raised" not in kinds and "stop_forced" not in kinds
    assert handle.run.state == {"finished": True}


def test_kx_stop_on_a_suspended_run_only_records_the_request(store: Store) -> None:
    @kx.agent(name=name("idle"))
    def idle(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            if i == 0:
                kx.stop(run.id, source="self")

    assert idle.start(run_id="idle-1").wait(WAIT) == "suspended"
    assert kx.stop("idle-1", source="late") == "suspended"
    stops = events_of(store, "idle-1", "stop_requested")
    assert [(e["source"], e["to_status"]) for e in stops] == [("self", "stopping"), ("late", None)]
    assert store.get_run("idle-1")["status"] == "suspended"
    with pytest.raises(kx.RunNotFound):
        kx.stop("no-such-run")


@pytest.mark.duckdb_only
def test_a_stop_from_elsewhere_is_seen_at_the_next_safe_point_after_a_monitor_look(
    store: Store,
) -> None:
    """The monitor looked just before another process recorded the stop: the safe point
    right after must still look, so the stop takes hold within the running step."""
    from kernelext._core.engine.run_engine import STOP_POLL_SECONDS, RunEngine

    run_id = name("elsewhere")
    assert store.create_run(run_id, "elsewhere")
    run = RunEngine(store, run_id, "elsewhere", max_step_seconds=None)
    run.safe_point()  # a safe point looked: nothing yet
    time.sleep(0.15)  # the step runs (longer than the safe points' poll interval)
    assert run.poll_external_stop(wait=True) is False  # the monitor's look: nothing yet
    store.request_stop(run_id, source="cli")  # another process records the stop
    # The monitor's look did not count as a safe point's: the next safe point is due to look.
    assert time.monotonic() - run._stop_polled >= STOP_POLL_SECONDS
    # It looks only if the store answers at once; while the store's writer holds it (its
    # idle tick, on a loaded machine), the look is not made and the next safe point makes it.
    for _ in range(500):
        try:
            run.safe_point()  # the end of the step: the stop is honoured here
        except kx.StopRequested:
            break
        assert time.monotonic() - run._stop_polled >= STOP_POLL_SECONDS, "looked, saw nothing"
        time.sleep(0.001)
    else:
        pytest.fail("no safe point honoured the stop recorded in the store")
    assert run.stop_source == "cli"


def _call_then_work(run_id: str, release: threading.Event, after: list[str]) -> Any:
    """An agent whose step makes one slow recorded call, then runs code of its own."""

    @kx.effect
    def slow_call() -> str:
        while not release.is_set():
            time.sleep(0.01)
        return "sent"

    @kx.agent(name=name("call-then-work"))
    def agent(run: kx.Run) -> None:
        with run.step("call"):
            slow_call()
            after.append("after the call")
            for _ in range(3000):  # the agent's own code: a forced stop cuts it
                time.sleep(0.01)

    handle = agent.start(run_id=run_id)
    wait_until(lambda: bool(store_effects(handle)), "the call's intent in the store", WAIT)
    return handle


def store_effects(handle: Any) -> list[Any]:
    from kernelext._core.lifecycle.run import engine_of

    return list(engine_of(handle.run).effects)


@pytest.mark.duckdb_only
def test_force_stop_lands_when_the_call_in_flight_returns_which_keeps_its_outcome(
    store: Store,
) -> None:
    release, after = threading.Event(), []
    handle = _call_then_work("force-waits", release, after)
    handle.force_stop(source="button")
    time.sleep(0.5)  # the monitor looks every 50 ms: it does not cut the call
    assert handle.alive and not after
    release.set()  # the call returns normally
    assert handle.wait(WAIT) == "suspended"
    assert after == ["after the call"]  # landed in the agent's code right after it
    (effect,) = store.load_effects("force-waits").values()
    assert (effect["status"], effect["result"]) == ("applied", '"sent"')
    (step,) = store.steps("force-waits")
    assert (step["status"], step["forced"]) == ("cancelled", True)


@pytest.mark.duckdb_only
def test_force_stop_cuts_the_call_once_its_grace_runs_out(store: Store) -> None:
    kx.configure(force_call_grace=0.3)
    release, after = threading.Event(), []
    try:
        handle = _call_then_work("force-grace", release, after)
        handle.force_stop(source="button")
        assert handle.wait(WAIT) == "suspended"  # the call never returned: cut
    finally:
        release.set()
        kx.configure(force_call_grace=10.0)
    assert not after
    (effect,) = store.load_effects("force-grace").values()
    assert effect["status"] == "unknown"


def test_a_force_is_shown_before_the_suspension_it_caused_however_late_it_is_recorded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine records ``force_raised`` on its own thread, after raising the stop into
    the run; the run meanwhile ends ``suspended (forced)``. On a busy machine that thread
    can be held up between the two, and the timeline must still read in the order things
    happened: the force, then the suspension it caused."""
    stall_after_each_force(monkeypatch)  # the run ends meanwhile
    entered = threading.Event()

    @kx.agent(name=name("held-up"))
    def held_up(run: kx.Run) -> None:
        with run.step("blocked"):
            entered.set()
            for _ in range(6000):  # no safe point for ~60 s
                time.sleep(0.01)

    handle = held_up.start(run_id="held-up-1")
    assert entered.wait(WAIT)
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended"
    wait_until(
        lambda: "force_raised" in [e["kind"] for e in store.events("held-up-1")],
        "the force_raised event",
    )
    kinds = [e["kind"] for e in store.events("held-up-1")]
    assert kinds.index("force_raised") < kinds.index("stop_forced"), kinds
