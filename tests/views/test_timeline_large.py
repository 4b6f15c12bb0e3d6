"""A timeline of 100,000 steps: folded into columns, bounded in size, totals kept.

The rows are the store's row shapes (``steps``, ``effects``, ``events``), built in memory:
the picture is a function of them (``Timeline.from_rows``), and 100,000 steps written to a
store first would only slow the test down.
"""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET
from typing import Any

from kernelext._core.views.timeline import Timeline
from kernelext._core.views.timeline_fold import COLUMNS, MAX_SHAPES

NS = {"svg": "http://www.w3.org/2000/svg"}
T0 = dt.datetime(2026, 3, 2, 9, 0, 0)
STEPS = 100_000
BOUND = 2_000_000  # bytes of HTML, whatever the number of steps


def rows(n: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    run = {"id": "big-batch", "agent": "score", "status": "completed", "lease_until": None}
    at = [T0 + dt.timedelta(seconds=i * 0.01) for i in range(n)]
    steps = [
        {"ordinal": i, "key": f"row-{i}", "status": "failed" if i % 97 == 0 else "completed",
         "started_at": at[i], "ended_at": None, "duration_s": 0.05, "forced": i == 5,
         "error": None}
        for i in range(n)
    ]  # fmt: skip
    effects = [
        {"key": f"k{i}", "tool": "post" if i % 3 else "get", "status": "applied",
         "step_key": f"row-{i}", "step_ordinal": i, "call_ordinal": 0,
         "intent_at": at[i] + dt.timedelta(seconds=0.01), "outcome_at": None,
         "decided_by": None, "error": None}
        for i in range(n)
    ]  # fmt: skip
    end = T0 + dt.timedelta(seconds=n * 0.01 + 1)
    events = [
        {"kind": "created", "occurred_at": T0, "to_status": "running"},
        {"kind": "completed", "occurred_at": end, "to_status": "completed"},
    ]
    return run, steps, effects, events


def counts(root: ET.Element, tag: str, cls: str) -> list[int]:
    """The count each folded shape's hover text starts with."""
    found = []
    for shape in root.iterfind(f".//svg:{tag}", NS):
        if cls in (shape.get("class") or "").split():
            title = shape.find("svg:title", NS)
            assert title is not None and title.text
            found.append(int(re.match(r"[\d,]+", title.text)[0].replace(",", "")))  # type: ignore[index]
    return found


def test_a_100000_step_timeline_is_folded_under_the_bound_and_keeps_its_totals() -> None:
    run, steps, effects, events = rows(STEPS)
    tl = Timeline.from_rows(run, steps, effects, events, now=T0 + dt.timedelta(hours=1))
    page = tl.html()
    assert len(page.encode()) < BOUND, len(page)
    root = ET.fromstring(page).find("svg:svg", NS)
    assert root is not None
    header = "".join(next(e for e in root.iter() if e.get("class") == "kx-header").itertext())
    assert f"{STEPS} step attempts" in header and f"{STEPS} effects" in header
    text = tl.text()
    assert f"{STEPS} step attempts (1 forced)" in text and f"{COLUMNS} columns" in text
    assert "drawn folded" in text  # what was folded is said
    steps_drawn, ticks_drawn = counts(root, "rect", "kx-step"), counts(root, "line", "kx-effect")
    assert sum(steps_drawn) == STEPS and sum(ticks_drawn) == STEPS  # nothing dropped
    assert len(steps_drawn) <= 2 * COLUMNS and len(ticks_drawn) <= COLUMNS
    rows_drawn = {e.get("data-status") for e in root.iterfind(".//svg:rect", NS)}
    assert {"completed", "failed"} <= rows_drawn  # the failures stay visible


def test_a_timeline_under_the_fold_draws_every_step() -> None:
    n = MAX_SHAPES // 2 - 1  # steps + effects + 2 marks: just under
    run, steps, effects, events = rows(n)
    tl = Timeline.from_rows(run, steps, effects, events, now=T0 + dt.timedelta(hours=1))
    root = ET.fromstring(tl.svg)
    drawn = [
        e for e in root.iterfind(".//svg:rect", NS) if e.get("class", "").startswith("kx-step")
    ]
    assert len(drawn) == n and "folded" not in tl.text()
