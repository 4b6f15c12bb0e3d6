"""The control panel (widgets/_panel.py) on real runs in a real store, without a kernel.

ipywidgets work without a front end (their comm is a no-op), so the panel's state and
its buttons are exercised directly; the notebook and browser tests show it in a kernel.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ipywidgets as w
import pytest

import kernelext as kx
from kernelext._core.lifecycle.cell_runs import cell_handle, forget_cell_runs, open_cell_run
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.process.runtime import runtime
from kernelext.widgets import (
    NEEDS_DECISION_WIDGETS,
    PANEL_ADDONS,
    ControlPanel,
    panel_for,
    panel_mimebundle,
)
from kernelext.widgets import _addons as addons
from kernelext.widgets._render import to_text, view_of
from kernelext.widgets._throttle import Throttle

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def store(store_path: Path) -> Iterator[Any]:
    opened = kx.open_store(str(store_path))
    yield opened
    with runtime().live_lock:
        handles = list(runtime().live_runs.values())
    for handle in handles:
        handle.wait(30)
    forget_cell_runs()
    runtime().settings.close()
    runtime().settings.use_store(None)


class Gate:
    """Lets a test decide when each step of an agent may end."""

    def __init__(self) -> None:
        self.steps = threading.Semaphore(0)
        self.started = threading.Semaphore(0)

    def step(self) -> None:
        self.started.release()
        assert self.steps.acquire(timeout=30), "the test never let the step end"

    def let(self, n: int = 1) -> None:
        for _ in range(n):
            self.steps.release()


def gated_agent(gate: Gate, name: str) -> Any:
    @kx.effect(name=f"{name}_send")
    def send(i: int) -> int:
        return i

    @kx.agent(name=name)
    def agent(run: kx.Run, n: int) -> int:
        for i in run.steps(range(n)):
            send(i)
            gate.step()
        return n

    return agent


def test_stop_then_resume_through_the_buttons(store: Any) -> None:
    gate = Gate()
    handle = gated_agent(gate, "buttons").start(3, run_id="b1")
    assert gate.started.acquire(timeout=30)
    panel = panel_for(handle)
    assert panel_for(handle) is panel
    assert not panel.stop_button.disabled
    assert panel.resume_button.disabled and not panel.force_button.disabled  # live: forceable
    assert not panel.remote.stop_disabled and not panel.remote.force_disabled
    assert "even while the kernel runs other cells" in panel.remote.stop_tooltip
    panel.stop_button.click()
    view = panel.view
    assert view is not None and view.status == "stopping"
    assert "stop pending since" in panel.stop_badge.value and "(panel)" in panel.stop_badge.value
    assert panel.stop_button.disabled and not panel.force_button.disabled
    gate.let()
    assert handle.wait(30) == "suspended"
    panel.refresh()
    assert "suspended" in panel.header.value and panel.stop_badge.value == ""
    # The deadline is set at suspension (user_stop: 7 days) and shown as time left.
    assert "expires in 6 d 23 h (" in panel.outcome.value or "expires in 7 d (" in (
        panel.outcome.value
    )
    assert not panel.resume_button.disabled and panel.stop_button.disabled
    gate.let(2)
    panel.resume_button.click()
    assert panel.handle is not handle  # the panel follows the resumed run
    assert panel.handle.wait(30) == "completed"
    panel.refresh()
    assert "completed: 3/3 steps" in panel.outcome.value
    assert panel.resume_button.disabled and panel.stop_button.disabled
    assert panel.progress.value == 3 and panel.progress.max == 3
    assert "buttons_send" in panel.effects.value and "applied" in panel.effects.value


def test_double_clicks_are_harmless(store: Any) -> None:
    gate = Gate()
    handle = gated_agent(gate, "double").start(2, run_id="d1")
    assert gate.started.acquire(timeout=30)
    panel = panel_for(handle)
    panel.stop_button.click()
    panel.stop_button.click()
    gate.let()
    assert handle.wait(30) == "suspended"
    gate.let(1)
    panel.resume_button.click()
    panel.resume_button.click()  # the run is executing again: refused, with a notice
    assert panel.handle.wait(30) == "completed"
    kinds = [e["kind"] for e in store.events("d1")]
    assert kinds.count("stop_requested") == 2  # both presses recorded...
    assert kinds.count("suspended") == 1 and kinds.count("resumed") == 1  # ...one stop, one resume
    assert [e["status"] for e in store.load_effects("d1").values()] == ["applied", "applied"]


def _forced_during_a_call(run_id: str, release: threading.Event) -> Any:
    @kx.effect
    def slow_call() -> str:
        while not release.is_set():
            time.sleep(0.01)
        return "done"

    @kx.agent(name="forced")
    def forced(run: kx.Run) -> None:
        with run.step("long"):
            slow_call()
        with run.step("never"):
            pass

    handle = forced.start(run_id=run_id)
    deadline = time.monotonic() + 30
    while not engine_of(handle.run).effects and time.monotonic() < deadline:
        time.sleep(0.01)
    return handle


def test_force_stop_waits_for_a_call_in_flight_which_keeps_its_real_outcome(store: Any) -> None:
    release = threading.Event()
    handle = _forced_during_a_call("f1", release)
    panel = panel_for(handle)
    assert not panel.force_button.disabled  # a live run can be forced without a Stop first
    panel.force_button.click()
    try:
        deadline = time.monotonic() + 30
        while panel.force_wait_text() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        text = panel.force_wait_text()
        assert text is not None and text.startswith("Force stop is waiting for slow_call")
        assert "press Force stop again" in text
        panel.refresh()
        assert "Force stop is waiting for slow_call" in panel.step.value
        assert handle.alive  # the call has not returned: nothing was cut
    finally:
        release.set()  # the call returns normally
    assert handle.wait(30) == "suspended"
    effects = list(store.load_effects("f1").values())
    assert [(e["status"], e["result"]) for e in effects] == [("applied", '"done"')]
    # Nothing of the agent's own code was left in the step: it ended with the call, and
    # the stop landed at once, before the next step.
    assert [s["key"] for s in store.steps("f1")] == ["long"]
    assert "force_requested" in [e["kind"] for e in store.events("f1")]


def test_a_second_force_stop_cuts_the_call_whose_outcome_becomes_unknown(store: Any) -> None:
    release = threading.Event()
    handle = _forced_during_a_call("f2", release)
    panel = panel_for(handle)
    panel.force_button.click()
    deadline = time.monotonic() + 30
    while panel.force_wait_text() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    panel.force_button.click()  # cut it now
    try:
        assert handle.wait(30) == "suspended"
    finally:
        release.set()
    assert [e["status"] for e in store.load_effects("f2").values()] == ["unknown"]


def test_needs_decision_shows_the_reason_and_the_slot(store: Any) -> None:
    @kx.effect
    def crashy() -> None:
        raise KeyboardInterrupt  # the outcome of the call is unknown

    @kx.agent(name="decide")
    def decide(run: kx.Run) -> None:
        with run.step("one"):
            crashy()

    decide.run(run_id="n1")
    made: list[Any] = []

    def factory(panel: ControlPanel) -> Any:
        made.append(panel.handle.run_id)
        return None

    class Addon(w.HTML):  # type: ignore[misc]
        def refresh(self) -> None:
            self.value = f"redrawn {len(made)}"

    def addon(panel: ControlPanel) -> Addon:
        return Addon()

    addons.uninstall()  # only this test's factories: the hint shows when none gives a widget
    NEEDS_DECISION_WIDGETS.append(factory)
    PANEL_ADDONS.append(addon)
    try:
        handle = kx.resume("n1")
        panel = ControlPanel(handle)
    finally:
        NEEDS_DECISION_WIDGETS.remove(factory)
        PANEL_ADDONS.remove(addon)
        addons.install()
    assert panel.view is not None and panel.view.status == "needs_decision"
    assert "needs a decision" in panel.outcome.value and "unknown" in panel.outcome.value
    assert made == ["n1"]
    assert "kx.reconcile('n1')" in panel.decision_slot.children[0].value
    [mine] = [c for c in panel.addons.children if isinstance(c, Addon)]
    assert mine.value == "redrawn 1"  # add-ons refresh with the panel
    assert not panel.resume_button.disabled


def test_static_html_and_text_fallbacks(store: Any) -> None:
    gate = Gate()
    gate.let(2)
    handle = gated_agent(gate, "static").run(2, run_id="s1")
    bundle = panel_mimebundle(handle)
    assert bundle[WIDGET_VIEW]["model_id"] == panel_for(handle).model_id
    assert 'class="kernelext-panel kernelext-static"' in bundle["text/html"]
    assert "completed: 2/2 steps" in bundle["text/html"]
    assert bundle["text/plain"].splitlines()[0] == "run s1 [static]: completed, 2/2 steps"
    assert "kernelext-panel" in panel_for(handle)._dom_classes
    assert to_text(view_of(handle)) == bundle["text/plain"]


def test_progress_counts_named_steps_around_a_loop(store: Any) -> None:
    @kx.agent(name="mixed")
    def mixed(run: kx.Run) -> None:
        with run.step("plan"):
            pass
        for _ in run.steps(range(3)):
            pass
        with run.step("report"):
            pass

    handle = mixed.run(run_id="mixed-1")
    assert handle.status == "completed"
    view = view_of(handle)
    assert view.completed == 5 and view.total == 4  # "plan" + 3 announced by the loop
    panel = panel_for(handle)
    assert "completed: 5 steps<" in panel.outcome.value  # never "5/4 steps"
    assert panel.progress.layout.display == "none"
    assert "<progress" not in panel_mimebundle(handle)["text/html"]


def test_worker_updates_are_throttled(store: Any) -> None:
    @kx.agent(name="fast")
    def fast(run: kx.Run) -> None:
        for _ in run.steps(range(300)):
            pass

    handle = fast.start(run_id="t1")
    panel = panel_for(handle)
    started = time.monotonic()
    assert handle.wait(60) == "completed"
    deadline = time.monotonic() + 10
    while panel.throttle.running and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed = time.monotonic() - started  # redraws go on until the throttle is idle
    redraws = panel.throttle.refreshes
    # each redraw waits out the interval since the last one: never more than ~10/s
    assert redraws <= elapsed / panel.throttle.interval + 3
    assert panel.throttle.pokes > redraws
    panel.refresh()
    assert "completed" in panel.header.value


def test_throttle_coalesces_a_burst_into_few_refreshes() -> None:
    drawn: list[float] = []  # each refresh's own stamp, the time the throttle spaces from
    throttle = Throttle(lambda: drawn.append(throttle._last), interval=0.1)
    started = time.monotonic()
    for _ in range(2000):
        throttle.poke()
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 10
    while throttle.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert 1 <= len(drawn) <= elapsed / 0.1 + 3
    # The throttle stamps a refresh before drawing it and waits out the interval from that
    # stamp: a pause of a busy machine between the stamp and the drawing cannot narrow a
    # gap between stamps (a time read in the callback could be late by any such pause).
    gaps = [b - a for a, b in itertools.pairwise(drawn)]
    assert all(gap >= 0.1 - 1e-9 for gap in gaps), gaps
    throttle.close()


def test_cell_run_panel_stops_at_once(store: Any) -> None:
    open_cell_run("cells-1")
    panel = panel_for(cell_handle("cells-1"))
    assert not panel.stop_button.disabled  # a cell run is stoppable between cells
    panel.stop_button.click()
    assert store.get_run("cells-1")["status"] == "suspended"
    assert panel.view is not None and panel.view.status == "suspended"
    panel.resume_button.click()
    assert store.get_run("cells-1")["status"] == "running"
    assert panel.notice.value and "%%agent cells" in panel.notice.value


def test_detach_stops_following(store: Any) -> None:
    gate = Gate()
    handle = gated_agent(gate, "detach").start(1, run_id="x1")
    panel = panel_for(handle)
    assert panel._on_run_event in engine_of(handle.run).listeners
    panel.detach()
    assert panel._on_run_event not in engine_of(handle.run).listeners
    gate.let()
    assert handle.wait(30) == "completed"
