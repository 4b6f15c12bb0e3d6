"""Stops that the agent's code cannot swallow (issue 12, item 6).

A bare ``except:`` (or ``except BaseException``) in an agent catches ``StopRequested``
and ``ForcedStop`` too. Once kernelext raised a stop into the agent, every later safe
point, effect call and the agent's return raise it again, and the swallowing is
recorded as an event, so such code delays a stop by at most the rest of one step.

No timing assertions: the tests wait for events and gates (with generous bounds).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support.live import name, wait_until

import kernelext as kx
from kernelext._core.engine.run_engine import RunEngine
from kernelext._store import Store

WAIT = 60.0


def kinds(store: Store, run_id: str) -> list[str]:
    return [str(e["kind"]) for e in store.events(run_id)]


def steps_of(store: Store, run_id: str) -> dict[str, tuple[str, bool]]:
    return {s["key"]: (s["status"], bool(s["forced"])) for s in store.steps(run_id)}


class World:
    """What the agents did: step bodies entered, deliveries made, signals swallowed."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.delivered: list[Any] = []
        self.swallowed: list[type[BaseException]] = []
        self.entered = threading.Event()
        self.go = threading.Event()

    def swallow(self) -> None:
        """Call from inside a bare ``except:``: note what it caught."""
        import sys

        caught = sys.exc_info()[0]
        assert caught is not None
        self.swallowed.append(caught)

    def spin(self) -> None:
        """Pure Python, no kernelext call: only an asynchronous exception ends it."""
        for _ in range(6000):  # bounded (~60 s): the forced stop lands long before
            time.sleep(0.01)


@pytest.fixture
def world() -> World:
    return World()


def effect_for(world: World) -> kx.Effect:
    @kx.effect(name=name("deliver"))
    def deliver(item: Any) -> None:
        world.delivered.append(item)

    return deliver


# -- soft stop ------------------------------------------------------------------------------
def test_a_bare_except_around_the_step_body_delays_the_stop_by_at_most_one_step(
    store: Store, world: World
) -> None:
    deliver = effect_for(world)

    @kx.agent(name=name("body-except"))
    def agent(run: kx.Run) -> None:
        for i in run.steps(range(10)):
            world.bodies.append(i)
            try:
                if i == 3:
                    world.entered.set()
                    assert world.go.wait(WAIT)
                run.checkpoint()  # the stop is raised here, inside the try
            except:  # noqa: E722 - the point of the test
                world.swallow()
            deliver(i)  # after the swallow: raised again here, never delivered

    handle = agent.start(run_id=name("body"))
    assert world.entered.wait(WAIT)
    assert handle.stop(source="test") == "stopping"
    world.go.set()
    assert handle.wait(WAIT) == "suspended"
    assert world.swallowed == [kx.StopRequested]
    assert world.bodies == [0, 1, 2, 3]
    assert world.delivered == [0, 1, 2]
    assert kinds(store, handle.run_id).count("stop_swallowed") == 1
    (swallowed,) = [e for e in store.events(handle.run_id) if e["kind"] == "stop_swallowed"]
    assert "deliver" in swallowed["reason"] and swallowed["source"] == "engine"
    assert steps_of(store, handle.run_id)["3"] == ("cancelled", False)
    assert store.get_run(handle.run_id)["reason"] == "user_stop"


@pytest.mark.parametrize("after_loop", ["effect", "return"])
def test_a_bare_except_around_the_whole_loop_cannot_turn_a_stop_into_completed(
    store: Store, world: World, after_loop: str
) -> None:
    deliver = effect_for(world)

    @kx.agent(name=name("loop-except"))
    def agent(run: kx.Run) -> None:
        try:
            for i in run.steps(range(10)):
                world.bodies.append(i)
                if i == 3:
                    world.entered.set()
                    assert world.go.wait(WAIT)
        except:  # noqa: E722 - the point of the test
            world.swallow()
        if after_loop == "effect":
            deliver("after the loop")

    handle = agent.start(run_id=name(f"loop-{after_loop}"))
    assert world.entered.wait(WAIT)
    handle.stop(source="test")
    world.go.set()
    assert handle.wait(WAIT) == "suspended"
    assert world.swallowed == [kx.StopRequested]
    assert world.bodies == [0, 1, 2, 3]  # nothing after the step that was running
    assert world.delivered == []
    assert kinds(store, handle.run_id).count("stop_swallowed") == 1
    steps = steps_of(store, handle.run_id)
    assert [k for k, (status, _) in steps.items() if status == "completed"] == ["0", "1", "2", "3"]
    # The run goes on from where it was stopped.
    world.go.set()
    resumed = kx.resume(handle.run_id)
    assert resumed.wait(WAIT) == "completed"
    assert world.bodies == [0, 1, 2, 3, *range(4, 10)]


def test_a_swallowed_stop_is_raised_again_until_the_flag_is_cleared(store: Store) -> None:
    run_id = name("flag")
    assert store.create_run(run_id, "flag")
    run = RunEngine(store, run_id, "flag", max_step_seconds=None)
    run.enforce_stop("an effect call")  # nothing delivered yet: nothing raised
    run.stop_event.set()
    run.enforce_stop("an effect call")  # requested, not yet delivered: the step goes on
    with pytest.raises(kx.StopRequested):
        run.safe_point()
    for where in ("an effect call", "a safe point", "the end of the agent"):
        with pytest.raises(kx.StopRequested):
            run.enforce_stop(where)
    assert kinds(store, run_id).count("stop_swallowed") == 1  # recorded once per stop
    run.stop_event.clear()  # a %%agent cell run's resume clears the flag
    run.enforce_stop("an effect call")
    run.safe_point()


# -- forced stop ----------------------------------------------------------------------------
def test_a_forced_stop_swallowed_by_the_step_body_is_raised_again_and_recorded(
    store: Store, world: World
) -> None:
    deliver = effect_for(world)

    @kx.agent(name=name("force-body"))
    def agent(run: kx.Run) -> None:
        for i in run.steps(range(5)):
            world.bodies.append(i)
            if i == 1:
                try:
                    world.entered.set()  # inside the try: the forced stop may land at once
                    world.spin()
                except:  # noqa: E722 - the point of the test
                    world.swallow()
            deliver(i)  # the forced stop is raised again here

    handle = agent.start(run_id=name("fbody"))
    assert world.entered.wait(WAIT)
    handle.force_stop(source="test")
    assert handle.wait(WAIT) == "suspended"
    assert world.swallowed == [kx.ForcedStop]
    assert world.bodies == [0, 1]
    assert world.delivered == [0]
    events = kinds(store, handle.run_id)
    assert {"force_requested", "force_raised", "force_swallowed", "stop_forced"} <= set(events)
    assert events.count("force_swallowed") == 1
    (swallowed,) = [e for e in store.events(handle.run_id) if e["kind"] == "force_swallowed"]
    assert "ForcedStop" in swallowed["reason"] and '"step": "1"' in swallowed["detail"]
    assert steps_of(store, handle.run_id) == {"0": ("completed", False), "1": ("cancelled", True)}


def test_a_forced_stop_swallowed_around_the_whole_loop_still_suspends_the_run(
    store: Store, world: World
) -> None:
    @kx.agent(name=name("force-loop"))
    def agent(run: kx.Run) -> None:
        try:
            for i in run.steps(range(5)):
                world.bodies.append(i)
                if i == 1:
                    world.entered.set()
                    world.spin()
        except:  # noqa: E722 - the point of the test
            world.swallow()
        # ... and the agent returns as if it had finished

    handle = agent.start(run_id=name("floop"))
    assert world.entered.wait(WAIT)
    handle.force_stop(source="test")
    assert handle.wait(WAIT) == "suspended"
    assert world.swallowed == [kx.ForcedStop]
    assert world.bodies == [0, 1]
    events = kinds(store, handle.run_id)
    assert "force_swallowed" in events and "completed" not in events
    assert steps_of(store, handle.run_id)["1"] == ("cancelled", True)
    row = store.get_run(handle.run_id)
    assert (row["status"], row["reason"]) == ("suspended", "user_stop")


def test_a_forced_stop_waits_for_a_call_blocked_in_c_and_the_panel_says_so(
    store: Store, world: World
) -> None:
    from kernelext.widgets import panel_for
    from kernelext.widgets._panel import OVERRUNNING

    @kx.agent(name=name("blocked"))
    def agent(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            world.bodies.append(i)
            if i == 0:
                world.entered.set()
                world.go.wait(WAIT)  # blocked in C: the forced stop lands after it returns

    handle = agent.start(run_id=name("blocked"))
    assert world.entered.wait(WAIT)
    panel = panel_for(handle)
    panel.refresh()
    assert OVERRUNNING not in panel.step.value
    handle.force_stop(source="test")
    wait_until(lambda: "force_raised" in kinds(store, handle.run_id), "the force_raised event")
    panel.refresh()
    assert OVERRUNNING in panel.step.value
    assert "blocked in C" in panel.step.value
    world.go.set()
    assert handle.wait(WAIT) == "suspended"
    panel.refresh()
    assert OVERRUNNING not in panel.step.value
    assert world.bodies == [0]
    assert steps_of(store, handle.run_id) == {"0": ("cancelled", True)}
    panel.detach()
