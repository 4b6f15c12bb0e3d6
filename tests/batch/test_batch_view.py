"""Seeing a batch (``run.map``): ``h.status_text``, ``kernelext show``, the panel's batch bar,
the timeline's rows of items that ran at once, and the resume plan of a run stopped in one.

Real runs on a real store; items are held on events the test releases, so every count is
known when it is read. ``kernelext show`` runs as users run it, in another process.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.cli import kernelext_cli as cli
from support.live import name, wait_until

import kernelext as kx
from kernelext._core.batch.view import BatchCounts
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.views.timeline import MAX_LANES, Bar, assign_lanes, timeline
from kernelext._formatting import counted, rate_text
from kernelext._store import Store
from kernelext.status import StepStatus
from kernelext.widgets import ControlPanel
from kernelext.widgets import _addons as addons
from kernelext.widgets._render import to_html, to_text
from kernelext.widgets._timeline import LiveTimeline

WAIT = 60.0
SVG = "{http://www.w3.org/2000/svg}"

pytestmark = pytest.mark.both_backends


class Held:
    """Items from ``first`` on wait until the test lets them go (polling, so a forced
    stop lands in them); earlier items return at once."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.go = threading.Event()
        self.started: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, item: int) -> int:
        with self.lock:
            self.started.append(item)
        if item >= self.first:
            while not self.go.wait(0.01):
                pass
        return item * 10


def batch_agent(held: Callable[[int], int], *, concurrency: int, label: str = "enrich") -> Any:
    @kx.agent(name=name("batched"))
    def batched(run: kx.Run, n: int) -> list[int]:
        return run.map(
            held, range(n), key=lambda i: f"item-{i}", concurrency=concurrency, name=label
        )

    return batched


def wait_for_flight(handle: Any, held: Held, done: int, in_flight: int, *, total: int) -> None:
    """Until the run's batch of ``total`` items (not an earlier batch of the run, which
    may pass through the same counts) has ``done`` items completed and ``in_flight``
    running, each of those inside ``held`` (an item is in flight from just before its
    step begins, before its function is called)."""

    def there() -> bool:
        batch = engine_of(handle.run).batch
        if batch is None:
            return False
        counts = batch.snapshot()
        return bool(
            (counts["total"], counts["done"], counts["in_flight"]) == (total, done, in_flight)
            and len(held.started) == done + in_flight
        )

    wait_until(there, f"{done} of {total} items done and {in_flight} in flight")


# -- the words -------------------------------------------------------------------------------
def test_a_batch_reads_in_one_style() -> None:
    counts = BatchCounts(
        name="enrich", total=400, done=120, in_flight=16, failed=2, waiting=3,
        per_second=35.2, seconds_left=8.0, drain_s=3.0,
    )  # fmt: skip
    assert counts.text == (
        "batch enrich: 120/400 done, 16 in flight, 2 failed, 3 waiting for a person, "
        "35 items/s, about 8.0 s left"
    )
    stopping = replace(counts, name=None, failed=0, waiting=0, stopping=True)
    assert stopping.text == "stopping: 16 items in flight, about 3.0 s (120/400 done)"
    assert replace(stopping, in_flight=1, drain_s=0.0).drain_text() == (
        "stopping: 1 item in flight, any moment now"
    )
    ended = replace(counts, in_flight=0, ended=True)
    assert ended.text == "batch enrich: 120/400 done, 2 failed, 3 waiting for a person, 35 items/s"
    assert [rate_text(r) for r in (1234.5, 2.5, 1.0, 0.5, 0.001)] == [
        "1234 items/s", "2.5 items/s", "1 item/s", "30 items/min", "<1 item/min",
    ]  # fmt: skip
    assert (counted(1, "item"), counted(0, "item")) == ("1 item", "0 items")


# -- h.status_text ---------------------------------------------------------------------------
def test_status_text_counts_the_batch_then_names_the_items_in_flight_while_it_drains(
    store: Store,
) -> None:
    held = Held(first=5)
    handle = batch_agent(held, concurrency=8).start(40)
    try:
        wait_for_flight(handle, held, done=5, in_flight=8, total=40)
        running = handle.status_text
        assert "; batch enrich: 5/40 done, 8 in flight, " in running
        assert "items/s, about " in running and running.endswith(" left")
        assert handle.stop() == "stopping"
        draining = handle.status_text
        assert "; stopping: 8 items in flight, " in draining, draining
        assert draining.endswith(" (5/40 done)"), draining
        assert "stop pending" not in draining  # not the estimate of a single step
    finally:
        held.go.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    after = handle.status_text
    assert "suspended, 13/40 steps" in after and "in flight" not in after


def test_an_item_leaves_the_items_in_flight_in_the_instant_it_is_counted(store: Store) -> None:
    """The counts hold each item once: when it is counted done (or failed) it is no longer
    in flight, for whoever reads them at that moment (a listener of the run, here)."""
    begin = threading.Event()
    seen: list[tuple[str, bool]] = []

    def one(item: int) -> int:
        if item % 3 == 0:
            raise ValueError(f"row {item} is malformed")
        return item

    @kx.agent(name=name("counted"))
    def counted_items(run: kx.Run, n: int) -> int:
        assert begin.wait(WAIT)
        values = run.map(one, range(n), key=str, concurrency=4, return_exceptions=True)
        return sum(isinstance(v, int) for v in values)

    def listen(what: str, value: Any) -> None:
        info = value[0] if what == "item_failed" else value
        if what in (StepStatus.COMPLETED, "item_failed") and info.batch is not None:
            seen.append((info.key, info.key in {i.key for i in info.batch.flight()}))

    handle = counted_items.start(12)
    engine_of(handle.run).listeners.append(listen)
    begin.set()
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == 8
    assert sorted(key for key, _ in seen) == sorted(str(i) for i in range(12))
    assert [key for key, in_flight in seen if in_flight] == []


# -- kernelext show ------------------------------------------------------------------------------
def test_kernelext_show_in_another_process_says_how_many_items_are_in_flight(
    store: Store, store_path: Path
) -> None:
    held = Held(first=3)
    handle = batch_agent(held, concurrency=10).start(30)
    try:
        wait_for_flight(handle, held, done=3, in_flight=10, total=30)
        shown = cli("show", handle.run_id, store=store_path)
        assert "  batch enrich: 3/30 done, 10 in flight" in shown.stdout, shown.stderr
        handle.stop()
        shown = cli("show", handle.run_id, store=store_path)
        assert "status stopping" in shown.stdout, shown.stderr
        (line,) = [ln for ln in shown.stdout.splitlines() if "items in flight" in ln]
        assert line.startswith("  stopping: 10 items in flight") and line.endswith("(3/30 done)")
        data = json.loads(cli("show", handle.run_id, "--json", store=store_path).stdout)
        assert data["batch"]["in_flight"] == 10 and data["batch"]["done"] == 3
        assert data["batch"]["stopping"] is True
        assert sorted(data["batch"]["in_flight_keys"]) == sorted(
            f"item-{i}" for i in held.started if i >= 3
        )
    finally:
        held.go.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    shown = cli("show", handle.run_id, store=store_path)
    assert "in flight" not in shown.stdout  # suspended: nothing runs


# -- the panel -------------------------------------------------------------------------------
def batch_box(panel: ControlPanel) -> ET.Element:
    return ET.fromstring(panel.batch.value)


def part(box: ET.Element, cls: str) -> ET.Element:
    (found,) = [e for e in box.iter() if cls in (e.get("class") or "").split()]
    return found


def test_the_panel_draws_the_batch_as_it_goes_and_its_drain(store: Store) -> None:
    addons.install()  # an earlier test may have unloaded the extension (and its add-ons)
    held = Held(first=5)
    handle = batch_agent(held, concurrency=8).start(40)
    panel = ControlPanel(handle)
    try:
        wait_for_flight(handle, held, done=5, in_flight=8, total=40)
        panel.refresh()
        box = batch_box(panel)
        assert box.get("class") == "kx-batch" and box.get("data-state") == "running"
        assert (box.get("data-total"), box.get("data-done"), box.get("data-in-flight")) == (
            "40",
            "5",
            "8",
        )
        bar = part(box, "kx-batch-progress")
        assert bar.get("role") == "progressbar" and bar.get("aria-valuenow") == "5"
        assert part(bar, "kx-batch-done").get("data-count") == "5"
        assert part(bar, "kx-batch-in-flight").get("data-count") == "8"
        assert part(bar, "kx-batch-failed").get("data-count") == "0"
        text = part(box, "kx-batch-text").text or ""
        assert text.startswith("batch enrich: 5/40 done, 8 in flight, ") and "items/s" in text
        assert panel.progress.layout.display == "none"  # the batch bar, not a second one
        assert panel.step.value == ""  # no "between steps": the batch box says what runs
        assert panel.throttle.interval == 0.2  # redraws during a batch: at most 5 a second

        panel.stop_button.click()
        box = batch_box(panel)
        assert box.get("data-state") == "stopping"
        drain = part(box, "kx-batch-drain").text or ""
        assert drain.startswith("stopping: 8 items in flight"), drain
        (live,) = [c for c in panel.addons.children if isinstance(c, LiveTimeline)]
        assert live.estimate.value == ""  # the batch box says how the stop drains
        assert panel.view is not None and "stopping: 8 items in flight" in to_text(panel.view)
    finally:
        held.go.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    # Updated as the items end, by the panel's own redraws (nobody calls refresh here).
    wait_until(lambda: 'data-state="ended"' in panel.batch.value, "the batch drawn as ended")
    box = batch_box(panel)
    assert box.get("data-done") == "13" and box.get("data-in-flight") == "0"
    assert (part(box, "kx-batch-text").text or "").startswith("batch enrich: 13/40 done")
    assert panel.view is not None and 'class="kx-batch"' in to_html(panel.view)
    assert panel.throttle.interval == 0.1
    panel.detach()


def test_the_panel_counts_failed_items_and_items_waiting_for_a_person(store: Store) -> None:
    begin = threading.Event()

    @kx.effect(name=name("pay"), needs_approval=lambda item, **kw: item % 2 == 0)
    def pay(item: int, *, idempotency_key: str | None = None) -> int:
        return item

    def one(item: int) -> int:
        if item == 3:
            raise ValueError("row 3 is malformed")
        return pay(item)

    @kx.agent(name=name("mixed"))
    def mixed(run: kx.Run, n: int) -> list[Any]:
        assert begin.wait(WAIT)
        return run.map(one, range(n), key=str, concurrency=4, return_exceptions=True)

    handle = mixed.start(12)
    panel = ControlPanel(handle)
    begin.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    wait_until(lambda: 'data-state="ended"' in panel.batch.value, "the batch drawn as ended")
    box = batch_box(panel)
    counts = {
        suffix: part(box, f"kx-batch-{suffix}").get("data-count")
        for suffix in ("done", "failed", "waiting", "in-flight")
    }
    assert counts == {"done": "5", "failed": "1", "waiting": "6", "in-flight": "0"}
    text = part(box, "kx-batch-text").text or ""
    assert text.startswith("batch: 5/12 done, 1 failed, 6 waiting for a person")
    plan = kx.plan(handle.run_id)
    assert plan.batch is not None
    assert (
        "batch: run.map: 5 of 12 items done; a resume runs the 7 not completed "
        "(1 failed: 3; 6 wait for a person: " in str(plan)
    )
    assert sorted(plan.batch.waiting, key=int) == ["0", "2", "4", "6", "8", "10"]
    panel.detach()


# -- the timeline ----------------------------------------------------------------------------
def lanes_of(svg: str) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.fromstring(svg)
    bars = [e for e in root.iter(f"{SVG}rect") if "kx-step" in (e.get("class") or "").split()]
    return root, bars


def test_items_that_ran_at_once_are_drawn_in_rows_of_their_own(store: Store) -> None:
    width = 32
    together = threading.Barrier(width, timeout=WAIT)

    def one(item: int) -> int:
        together.wait()  # every item runs while all the others do
        return item

    @kx.agent(name=name("wide"))
    def wide(run: kx.Run) -> list[int]:
        return run.map(one, range(width), concurrency=width)

    handle = wide.start()
    assert handle.wait(WAIT) == "completed", handle.error
    picture = timeline(handle.run_id)
    assert picture.lanes == width and picture.folded == 0
    assert sorted(bar.lane for bar in picture.bars) == list(range(width))
    for compact in (False, True):
        root, bars = lanes_of(picture.render(compact=compact))
        assert root.get("data-lanes") == str(width)
        assert sorted(int(b.get("data-lane") or -1) for b in bars) == list(range(width))
        tops = {float(b.get("y") or 0) for b in bars}
        assert len(tops) == width  # one row each, none drawn over another
    assert f"up to {width} steps at once" in picture.text()

    @kx.agent(name=name("narrow"))
    def narrow(run: kx.Run) -> None:
        for _ in run.steps(range(6)):
            pass

    one_by_one = timeline(narrow.run().run_id)
    assert one_by_one.lanes == 1 and {bar.lane for bar in one_by_one.bars} == {0}
    root, _ = lanes_of(one_by_one.svg)
    assert root.get("data-lanes") == "1" and "at once" not in one_by_one.text()


def test_more_items_at_once_than_rows_are_folded_into_the_rows() -> None:
    t0 = dt.datetime(2026, 3, 2, 9, 0, 0)

    def bar(i: int, start: float, end: float) -> Bar:
        at = t0 + dt.timedelta(seconds=start)
        done = t0 + dt.timedelta(seconds=end)
        return Bar(i, f"item-{i}", "completed", at, done, False, False, "")

    wide = [bar(i, 0.001 * i, 10.0) for i in range(MAX_LANES + 8)]
    placed = assign_lanes(wide)
    assert {b.lane for b in placed} == set(range(MAX_LANES))
    assert sum(b.folded for b in placed) == 8
    assert [b.key for b in placed] == [b.key for b in wide]  # order kept
    # One after another (each beginning as the one before ends): one row.
    chain = [bar(i, i, i + 1.0) for i in range(5)]
    assert {b.lane for b in assign_lanes(chain)} == {0}
    # Two at a time, then one: two rows, reused.
    pairs = [bar(0, 0, 2), bar(1, 0.5, 1), bar(2, 1.2, 3), bar(3, 2.5, 4)]
    assert [b.lane for b in assign_lanes(pairs)] == [0, 1, 1, 0]


# -- the resume plan -------------------------------------------------------------------------
def test_the_plan_of_a_run_stopped_in_a_batch_says_what_is_done_and_what_runs_again(
    store: Store,
) -> None:
    held = Held(first=20)
    handle = batch_agent(held, concurrency=10).start(100)
    try:
        wait_for_flight(handle, held, done=20, in_flight=10, total=100)
        handle.force_stop()  # the items in flight are cancelled
        assert handle.wait(WAIT) == "suspended", handle.error
    finally:
        held.go.set()
    flying = [f"item-{i}" for i in held.started if i >= 20]
    plan = kx.plan(handle.run_id)
    assert plan.batch is not None
    assert (plan.batch.done, plan.batch.total, plan.batch.not_completed) == (20, 100, 80)
    assert sorted(plan.batch.stopped) == sorted(flying)
    text = str(plan)
    assert (
        "batch: run.map 'enrich': 20 of 100 items done; a resume runs the 80 not completed "
        f"(10 were in flight when it stopped: {', '.join(plan.batch.stopped[:8])} and 2 more)"
    ) in text
    assert plan.to_dict()["batch"]["stopped"] == list(plan.batch.stopped)
    assert "run.map &#x27;enrich&#x27;: 20 of 100 items done" in plan._repr_html_()

    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert kx.plan(handle.run_id).batch is None  # nothing left to run


def test_the_plan_counts_the_items_of_the_batch_it_stopped_in(store: Store) -> None:
    held = Held(first=5)

    @kx.agent(name=name("two"))
    def two(run: kx.Run) -> list[int]:
        first = run.map(lambda i: i, range(10), key=lambda i: f"a-{i}")
        return first + run.map(held, range(50), key=lambda i: f"b-{i}", concurrency=4)

    handle = two.start()
    try:
        wait_for_flight(handle, held, done=5, in_flight=4, total=50)
        handle.stop()  # drains: the 4 in flight complete
    finally:
        held.go.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    plan = kx.plan(handle.run_id)
    assert plan.batch is not None and plan.batch.stopped == ()
    assert "batch: run.map: 9 of 50 items done; a resume runs the 41 not completed" in str(plan)
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert again.result == list(range(10)) + [i * 10 for i in range(50)]
