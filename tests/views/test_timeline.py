"""The run timeline picture: read back from its SVG, for a real run, a day-long suspension
on a fake clock, odd events, and the live version on the control panel."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.formatters import DisplayFormatter
from support.clocks import TickingClock
from support.live import name

import kernelext as kx
from kernelext._core.views.timeline import Timeline, mark_of, timeline
from kernelext._store import Store, open_store
from kernelext.status import Status, StepStatus

WAIT = 60.0
NS = {"svg": "http://www.w3.org/2000/svg"}
T0 = dt.datetime(2026, 3, 2, 9, 0, 0)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def shapes(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{{{NS['svg']}}}{tag}") if cls in e.get("class", "").split()]


def title_of(element: ET.Element) -> str:
    found = element.find("svg:title", NS)
    assert found is not None and found.text, f"{element.attrib} has no hover text"
    return found.text


@pytest.fixture
def twenty_steps(store: Store) -> Iterator[str]:
    """A run of 20 steps (one effect each) that stops twice at a step boundary and is
    forced once by max_step_seconds; each stop is followed by a resume."""
    stops_at = {5, 10}
    slow = [15]

    @kx.effect
    def deliver(item: int, *, idempotency_key: Any = None) -> dict[str, int]:
        return {"delivered": item}

    @kx.agent(name=name("twenty"), max_step_seconds=2.0)
    def twenty(run: kx.Run) -> None:
        for i in run.steps(range(20)):
            deliver(i)
            if i in stops_at:
                stops_at.discard(i)
                kx.stop(run.id, source="test")  # lands at the end of this step
            if slow and i == slow[0]:
                slow.clear()
                kx.stop(run.id, source="test")
                for _ in range(3000):  # bounded (~30 s); the monitor forces it at 2 s
                    time.sleep(0.01)

    handle = twenty.start(run_id="twenty-1")
    assert handle.wait(WAIT) == Status.SUSPENDED
    for _ in range(3):
        handle = kx.resume("twenty-1")
        handle.wait(WAIT)
    assert handle.wait(WAIT) == Status.COMPLETED
    yield "twenty-1"


def test_twenty_steps_two_stops_and_a_forced_stop_are_all_drawn(
    store: Store, twenty_steps: str
) -> None:
    tl = timeline(twenty_steps)
    root = parse(tl.svg)

    bars = shapes(root, "rect", "kx-step")
    completed = [b for b in bars if b.get("data-status") == StepStatus.COMPLETED]
    assert len(completed) == 20
    assert sorted(int(b.get("data-key", "")) for b in completed) == list(range(20))
    (forced,) = [b for b in bars if b.get("data-forced") == "true"]
    assert len(bars) == 21  # 20 steps + the attempt of step 15 that was forced
    assert (forced.get("data-key"), forced.get("data-status")) == ("15", StepStatus.CANCELLED)
    assert "kx-forced" in forced.get("class", "") and forced.get("stroke") == "#cf222e"
    assert "forced" in title_of(forced)
    xs = [
        float(b.get("x", "")) for b in sorted(completed, key=lambda b: int(b.get("data-key", "")))
    ]
    assert xs == sorted(xs)  # in time order along the axis

    ticks = shapes(root, "line", "kx-effect")
    assert len(ticks) == 20 and {t.get("data-status") for t in ticks} == {"applied"}
    assert all("deliver" in title_of(t) for t in ticks)

    marks = shapes(root, "g", "kx-mark")
    kinds = Counter(m.get("data-kind") for m in marks)
    assert kinds == {
        "start": 1, "stop_request": 3, "suspension": 3, "resume": 3, "forced": 1, "end": 1,
    }  # fmt: skip
    assert all(title_of(m) for m in marks)
    labels = {e.text for e in shapes(root, "text", "kx-mark-label")}
    assert {"stop", "suspended", "resumed", "forced", "suspended (forced)"} <= labels

    # The structured accessors say the same, in time order.
    story = [(m.kind, m.label) for m in tl.marks if m.kind != "stop_request"]
    assert story == [
        ("start", "start"),
        ("suspension", "suspended"), ("resume", "resumed"),
        ("suspension", "suspended"), ("resume", "resumed"),
        ("forced", "forced"), ("suspension", "suspended (forced)"), ("resume", "resumed"),
        ("end", "completed"),
    ]  # fmt: skip
    assert [m.time for m in tl.marks] == sorted(m.time for m in tl.marks)
    assert len(tl.bars) == 21 and sum(b.forced for b in tl.bars) == 1
    bands = {r.get("data-status") for r in shapes(root, "rect", "kx-status")}
    assert {"running", "stopping", "suspended"} <= bands
    assert tl.gaps == []  # nothing idle for long in this run

    # The compact version (the panel's) has the same bars and marks.
    compact = parse(tl.render(width=480, compact=True))
    assert len(shapes(compact, "rect", "kx-step")) == 21
    assert len(shapes(compact, "g", "kx-mark")) == len(marks)

    # What IPython sends to the front end, and nbconvert writes to HTML: a static picture.
    bundle, _ = DisplayFormatter().format(tl)
    html = bundle["text/html"]
    assert html.startswith(f'<div class="kernelext-timeline" data-run-id="{twenty_steps}">')
    inner = html[html.index("<svg") : html.rindex("</div>")]
    assert len(shapes(parse(inner), "rect", "kx-step")) == 21
    assert len(shapes(parse(bundle["image/svg+xml"]), "rect", "kx-step")) == 21
    assert bundle["text/plain"].startswith(f"timeline of run {twenty_steps}")
    assert "21 step attempts (1 forced), 20 effects" in bundle["text/plain"]


def write_steps(store: Store, clock: TickingClock, run_id: str, ordinals: range) -> None:
    for ordinal in ordinals:
        step_id = uuid.uuid4()
        store.begin_step(run_id, step_id, ordinal, str(ordinal), None)
        clock.advance(seconds=1.0)
        store.complete_step(run_id, step_id, ordinal, 1.0, {}, [], 0)


def test_a_day_suspended_is_cut_from_the_axis(store_path: Path) -> None:
    clock = TickingClock(T0)
    store = open_store(str(store_path), clock=clock)
    try:
        assert store.create_run("day-1", "daily")
        write_steps(store, clock, "day-1", range(5))
        store.request_stop("day-1", source="test")
        running = (Status.RUNNING, Status.STOPPING)
        store.transition("day-1", Status.SUSPENDED, running, kind=Status.SUSPENDED)
        clock.advance(seconds=86400.0)
        store.transition("day-1", Status.RUNNING, (Status.SUSPENDED,), kind="resumed")
        write_steps(store, clock, "day-1", range(5, 10))
        store.transition("day-1", Status.COMPLETED, running, kind=Status.COMPLETED)

        tl = timeline("day-1", store)
        ((start, end),) = tl.gaps
        assert (start, end) == (T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=86405))
        root = parse(tl.svg)
        (gap,) = shapes(root, "g", "kx-gap")
        assert float(gap.get("data-seconds", "")) == 86400.0
        assert "idle 1 d, not to scale" in title_of(gap)
        assert "1 d" in "".join(gap.itertext())
        widths = [float(b.get("width", "")) for b in shapes(root, "rect", "kx-step")]
        assert len(widths) == 10 and min(widths) > 30  # readable: the day takes no room
        (suspended,) = [
            r for r in shapes(root, "rect", "kx-status") if r.get("data-status") == "suspended"
        ]
        assert title_of(suspended).startswith("suspended for 1 d")
        assert "idle stretches cut from the axis: 1 d" in tl.text()

        # Without cutting, a day squeezes each one-second step to a sliver.
        uncut = timeline("day-1", store, idle_seconds=10 * 86400)
        assert uncut.gaps == []
        slivers = [float(b.get("width", "")) for b in shapes(parse(uncut.svg), "rect", "kx-step")]
        assert max(slivers) < 3
    finally:
        store.close()


def test_every_event_kind_becomes_a_mark_with_safe_text() -> None:
    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"kind": kind, "occurred_at": T0, "actor": "ana", "source": "panel", **fields}

    decided = event("approval_decided", detail='{"decision": "approved", "tool": "pay"}')
    assert mark_of(decided)[:2] == ("approval", "approved")
    assert mark_of(event("approval_requested"))[:2] == ("approval", "approval asked")
    assert mark_of(event("input_requested"))[:2] == ("question", "question")
    assert mark_of(event("effect_decided"))[:2] == ("decision", "decided")
    waiting = event(Status.SUSPENDED, reason="approval", to_status="suspended")
    assert mark_of(waiting)[:2] == ("suspension", "suspended (approval)")
    assert mark_of(event("expired", to_status="expired"))[0] == "expiry"
    assert mark_of(event("claim_taken"))[:2] == ("other", "claim taken")
    odd = event("stop_requested", reason="<b>&\x01'\"", to_status="stopping")
    assert "by ana via panel" in mark_of(odd).title

    run = {"id": "odd<&>", "agent": "a\x02", "status": "running", "lease_until": None}
    step = {
        "ordinal": 0, "key": "k<1>", "status": "running", "started_at": T0, "ended_at": None,
        "duration_s": None, "forced": False, "error": None,
    }  # fmt: skip
    tl = Timeline.from_rows(run, [step], [], [odd], now=T0 + dt.timedelta(seconds=4))
    root = parse(tl.svg)  # well-formed whatever the text
    (bar,) = shapes(root, "rect", "kx-step")
    assert bar.get("data-key") == "k<1>" and bar.get("stroke-dasharray") == "3 2"  # open
    assert "4.0 s so far" in title_of(bar)
    (mark,) = shapes(root, "g", "kx-mark")
    assert "<b>&\\x01'\"" in title_of(mark)  # a control character shown as its escape


def test_the_panel_shows_the_live_timeline_and_the_estimate(store: Store) -> None:
    from kernelext.widgets import ControlPanel
    from kernelext.widgets._addons import install
    from kernelext.widgets._timeline import LiveTimeline

    at_two, go = threading.Event(), threading.Event()

    @kx.agent(name=name("panelled"))
    def panelled(run: kx.Run) -> None:
        for i in run.steps(range(4)):
            if i == 2:
                kx.stop(run.id, source="test")
                at_two.set()
                assert go.wait(WAIT)

    install()
    try:
        handle = panelled.start(run_id="panelled-1")
        panel = ControlPanel(handle)
    finally:
        install()  # every add-on in place for the next test, whatever this one did
    try:
        (live,) = [c for c in panel.addons.children if isinstance(c, LiveTimeline)]
        assert at_two.wait(WAIT)
        panel.refresh()  # the panel redraws its add-ons: the estimate line follows at once
        assert 'class="kernelext-stop-estimate"' in live.estimate.value
        assert "stops after step 3" in live.estimate.value  # i == 2: the third step
        live.refresh_now()
        assert live.picture.value.startswith('<div class="kernelext-timeline"')
        svg = live.picture.value[live.picture.value.index("<svg") : -len("</div>")]
        statuses = [b.get("data-status") for b in shapes(parse(svg), "rect", "kx-step")]
        assert statuses == ["completed", "completed", "running"]
    finally:
        go.set()
    assert handle.wait(WAIT) == Status.SUSPENDED
    panel.refresh()
    live.refresh_now()
    assert live.estimate.value == "" and live.stop_estimate is None
    assert live.timeline is not None
    assert [m.kind for m in live.timeline.marks][-2:] == ["stop_request", "suspension"]
    panel.detach()
    live.detach()


def test_effects_outside_steps_are_drawn_without_the_internal_step_key(store: Store) -> None:
    """A run of tool calls without ``run.steps`` (what an LLM agent is): its effects are
    ticks said to be outside steps, and the picture never shows the internal key."""
    from kernelext._core.encoding.names import OUTSIDE_STEPS

    @kx.effect
    def lookup_order(order_id: str) -> dict[str, str]:
        return {"order": order_id}

    @kx.effect
    def refund(order_id: str) -> dict[str, str]:
        return {"refunded": order_id}

    @kx.agent(name=name("stepless"))
    def stepless(run: kx.Run) -> None:
        lookup_order("A-1")
        refund("A-1")

    handle = stepless.start(run_id="stepless-1")
    assert handle.wait(WAIT) == Status.COMPLETED
    assert set(kx.sql("SELECT step_key FROM effects WHERE run_id = 'stepless-1'")["step_key"]) == {
        OUTSIDE_STEPS
    }
    picture = timeline("stepless-1")
    root = parse(picture.svg)
    ticks = shapes(root, "line", "kx-effect")
    assert [t.get("data-tool") for t in ticks] == ["lookup_order", "refund"]
    assert [title_of(t).splitlines()[0] for t in ticks] == [
        "lookup_order [outside steps] call 0: applied",
        "refund [outside steps] call 1: applied",
    ]
    for shown in (picture.svg, picture.html(compact=True), picture.text()):
        assert OUTSIDE_STEPS not in shown
    (header,) = [t for t in root.iter(f"{{{NS['svg']}}}text") if "kx-header" in t.get("class", "")]
    assert header.text is not None and "completed · 2 calls · from " in header.text
    compact = picture.html(compact=True)
    assert "completed · 2 calls</text>" in compact
    assert "0 step attempts" not in compact


def glyph_top(mark: ET.Element) -> float:
    (path,) = mark.iter(f"{{{NS['svg']}}}path")
    found = re.match(r"M[-\d.]+,([-\d.]+)", path.get("d", ""))
    assert found, path.get("d")
    return float(found.group(1))


def test_stops_sit_on_the_status_band_text_is_readable_and_the_legend_lists_what_occurred(
    store: Store,
) -> None:
    @kx.effect
    def note(item: int) -> int:
        return item

    @kx.agent(name=name("three"))
    def three(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            note(i)
            if i == 1:
                kx.stop(run.id, source="test")  # lands at the end of this step

    handle = three.start(run_id=name("legend"))
    assert handle.wait(WAIT) == Status.SUSPENDED
    tl = timeline(handle.run_id)
    for svg in (tl.render(), tl.render(width=480, compact=True)):
        root = parse(svg)
        (stop,) = [m for m in shapes(root, "g", "kx-mark") if m.get("data-kind") == "stop_request"]
        (suspension,) = [
            m for m in shapes(root, "g", "kx-mark") if m.get("data-kind") == "suspension"
        ]
        lanes = {e.text: float(e.get("y", "0")) for e in shapes(root, "text", "kx-lane")}
        # the top of each glyph: the same for marks on the same lane (same size, same shape box)
        assert glyph_top(stop) == glyph_top(suspension), "a stop sits on the status band"
        assert glyph_top(stop) > lanes["asked"], "not on the asked lane"
        sizes = [float(root.get("font-size", "0"))]
        sizes += [float(e.get("font-size")) for e in root.iter() if e.get("font-size")]
        assert min(sizes) >= 11, "no text smaller than 11 px"
    legend = {e.text for e in shapes(parse(tl.render()), "text", "kx-legend")}
    assert legend == {"step completed", "effect applied", "stop asked", "suspended"}


def test_the_panel_timeline_follows_a_status_change_at_once(store: Store) -> None:
    """The compact timeline is redrawn with the panel when the status changed, not only
    at its own (slower) pace: never "running" beside a panel that says completed."""
    from kernelext.widgets import ControlPanel
    from kernelext.widgets._addons import install
    from kernelext.widgets._timeline import LiveTimeline

    go = threading.Event()

    @kx.agent(name=name("follows"))
    def follows(run: kx.Run) -> None:
        for _ in run.steps(range(2)):
            assert go.wait(WAIT)

    install()
    try:
        handle = follows.start(run_id=name("follows-1"))
        panel = ControlPanel(handle)
    finally:
        install()
    try:
        (live,) = [c for c in panel.addons.children if isinstance(c, LiveTimeline)]
        live.refresh_now()
        assert live.timeline is not None and live.timeline.status == Status.RUNNING
        live.throttle.interval = live.throttle.tick = 3600.0  # its own pace: never again
        go.set()
        assert handle.wait(WAIT) == Status.COMPLETED
        panel.refresh()
        assert live.timeline.status == Status.COMPLETED
        assert " · completed · " in live.picture.value  # the header says it too
    finally:
        go.set()
        panel.detach()


def test_a_bar_reads_a_step_s_duration_as_kernelext_show_does() -> None:
    """A stored duration on a unit's half (0.50049 ms) reads the same on the timeline as in
    ``kernelext show`` (``duration_text`` of the stored value): the bar's end is rounded to
    the microsecond, and 0.5 ms would read as 0 ms there."""
    import datetime as dt

    from kernelext._core.views.timeline import _bar
    from kernelext._formatting import duration_text

    start = dt.datetime(2026, 12, 6, 12, 0, 0)
    row = {
        "started_at": start,
        "status": "completed",
        "duration_s": 0.00050049,
        "ordinal": 1,
        "key": "quote",
    }
    bar = _bar(row, [], start, {1: 1})
    assert duration_text(0.00050049) == "1 ms"
    assert bar.title.splitlines()[1] == "1 ms"
