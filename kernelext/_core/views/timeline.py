"""The picture of a run: step attempts, effects and events on one time axis, as inline SVG.

``timeline(run_id)`` reads the run's steps, effects and events and returns a
:class:`Timeline`. In a notebook it displays as HTML holding an ``<svg>`` (so a notebook
saved to HTML keeps a static picture), with ``image/svg+xml`` as well; ``.svg`` is the
picture as text and ``.bars``, ``.ticks``, ``.marks``, ``.gaps`` are what it shows.

Lanes, top to bottom: one bar per step attempt (colour by status, a red outline when
forced; steps that ran at once, the items of a ``run.map``, each get a row of their own,
up to ``MAX_LANES`` rows, see :func:`assign_lanes`); one tick per effect call at its
intent (colour by status); what was asked (stop and force requests, decisions, approvals,
questions); what the run did (its transitions on a band coloured by status: suspended,
resumed, forced, expired, a ``run.map`` starting, ...). Every shape has
a ``<title>`` (hover text); marks have labels. Idle stretches are cut out of the axis: a
stretch with no step, effect or event, longer than ``idle_seconds`` and than three times
the longest step (a run suspended for a day), is drawn as a fixed-width break labelled
with its real length.
"""

from __future__ import annotations

import datetime as dt
import heapq
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..._formatting import counted, duration_text, step_label, step_numbers
from ..._shown import shows
from ..._store import Store
from ..._validate import RUN_ID, STORE, check_duration, validated
from ...status import FINAL, Reason, Status, StepStatus
from ..encoding.keys import call_text
from ..encoding.names import OUTSIDE_STEPS
from ..process.runtime import get_store
from .timeline_draw import draw
from .timeline_fold import fold, fold_note
from .timeline_svg import TimeAxis, clock, esc

__all__ = [
    "Bar",
    "EffectTick",
    "Gap",
    "Mark",
    "Span",
    "TimeAxis",
    "Timeline",
    "assign_lanes",
    "mark_of",
    "timeline",
]

# event kind -> (mark kind, label). Other kinds: "approval" if they name one, else "other".
MARKS: dict[str, tuple[str, str]] = {
    "created": ("start", "start"),
    "stop_requested": ("stop_request", "stop"),
    "force_requested": ("force_request", "force"),
    "force_raised": ("forced", "forced"),
    Status.SUSPENDED: ("suspension", Status.SUSPENDED),
    "stop_forced": ("suspension", f"{Status.SUSPENDED} (forced)"),
    "resume_failed": ("suspension", "resume failed"),
    "resumed": ("resume", "resumed"),
    Status.NEEDS_DECISION: ("decision_needed", "needs decision"),
    "effect_decided": ("decision", "decided"),
    "revalidation_decision": ("decision", "decided"),
    "approval_requested": ("approval", "approval asked"),
    "approval_decided": ("approval", "approval decided"),
    "approval_consumed": ("approval", "approval used"),
    "input_requested": ("question", "question"),
    "input_answered": ("question", "answered"),
    Status.EXPIRED: ("expiry", Status.EXPIRED),
    Status.COMPLETED: ("end", Status.COMPLETED),
    Status.FAILED: ("end", Status.FAILED),
    Status.CANCELLED: ("end", Status.CANCELLED),
    "restarted": ("end", "restarted"),
    "step_overran": ("overran", "overran"),
    "batch_started": ("batch_start", "run.map"),
    "effect_unknown": ("unknown_effect", "unknown effect"),
    "stop_swallowed": ("swallowed", "stop swallowed"),
    "force_swallowed": ("swallowed", "force swallowed"),
}


MAX_LANES = 32  # rows of step bars at most; more steps at once share the rows (folded)


class Bar(NamedTuple):
    """One step attempt. ``open``: its end is not known (still running, or abandoned).
    ``lane``: its row (0 at the top); ``folded``: it overlaps another bar of its row
    (more steps ran at once than there are rows)."""

    ordinal: int
    key: str
    status: str
    start: dt.datetime
    end: dt.datetime
    forced: bool
    open: bool
    title: str
    lane: int = 0
    folded: bool = False


def assign_lanes(bars: Sequence[Bar], max_lanes: int = MAX_LANES) -> list[Bar]:
    """``bars`` with their rows: bars whose spans overlap get different rows (greedy
    interval colouring: by start, each into the lowest row free then), so steps one after
    another share row 0 and a 32-wide batch fills 32 rows. Past ``max_lanes`` a bar goes
    into the row that frees first and is marked ``folded``. Order is kept."""
    order = sorted(range(len(bars)), key=lambda i: (bars[i].start, bars[i].end, i))
    busy: list[tuple[dt.datetime, int]] = []  # (end, lane) of rows in use
    free: list[int] = []  # rows free again (lowest first)
    used = 0
    placed: list[Bar] = list(bars)
    for i in order:
        bar = bars[i]
        while busy and busy[0][0] <= bar.start:  # ended when this one began: its row is free
            heapq.heappush(free, heapq.heappop(busy)[1])
        folded, until = False, bar.end
        if free:
            lane = heapq.heappop(free)
        elif used < max_lanes:
            lane, used = used, used + 1
        else:  # every row is in use: the one that frees first takes it too
            end, lane = heapq.heappop(busy)
            folded, until = True, max(end, bar.end)
        heapq.heappush(busy, (until, lane))
        placed[i] = bar._replace(lane=lane, folded=folded)
    return placed


class EffectTick(NamedTuple):
    """One effect call, at its intent."""

    tool: str
    status: str
    time: dt.datetime
    step_key: str
    title: str


class Mark(NamedTuple):
    """One event; ``kind`` is the mark kind (``stop_request``, ``suspended``, ...)."""

    kind: str
    label: str
    time: dt.datetime
    title: str


class Span(NamedTuple):
    """The run's status from one transition to the next."""

    status: str
    start: dt.datetime
    end: dt.datetime
    reason: str | None


class Gap(NamedTuple):
    """An idle stretch cut out of the axis (drawn shorter than it lasted)."""

    start: dt.datetime
    end: dt.datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def _detail(event: Mapping[str, Any]) -> dict[str, Any]:
    try:
        found = json.loads(event.get("detail") or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _lines(*parts: str) -> str:
    return "\n".join(part for part in parts if part)


def mark_of(event: Mapping[str, Any]) -> Mark:
    """The mark an ``events`` row is drawn as."""
    kind, reason = str(event["kind"]), event.get("reason")
    mark, label = MARKS.get(kind) or (
        "approval" if "approv" in kind else "other",
        kind.replace("_", " "),
    )
    if kind == Status.SUSPENDED and reason and reason != Reason.USER_STOP:
        label = f"suspended ({reason})"
    decided = _detail(event).get("decision")
    if kind == "approval_decided" and decided:
        label = str(decided)  # approved, rejected
    moved = f"{event.get('from_status') or '·'} → {event.get('to_status')}"
    title = _lines(
        f"{kind} at {clock(event['occurred_at'])}",
        moved if event.get("to_status") else "",
        f"by {event.get('actor') or '?'} via {event.get('source') or '?'}",
        str(reason or ""),
        str(event.get("detail") or "")[:300],
    )
    return Mark(mark, label, event["occurred_at"], title)


def _bar(
    row: Mapping[str, Any],
    effects: Sequence[Mapping[str, Any]],
    live: dt.datetime,
    numbers: Mapping[int, int],
) -> Bar:
    start, status, duration = row["started_at"], str(row["status"]), row.get("duration_s")
    ended, is_open = row.get("ended_at"), False
    if duration is not None:
        end = start + dt.timedelta(seconds=float(duration))
    elif status == StepStatus.RUNNING:
        end, is_open = max(live, start), True
    elif ended is not None and status != StepStatus.ABANDONED:
        end = ended
    else:  # abandoned: its process ended; the last thing known of it is its last effect
        seen = [
            e.get("outcome_at") or e["intent_at"] for e in effects if e["step_key"] == row["key"]
        ]
        end = max([start, *(t for t in seen if t >= start and (ended is None or t <= ended))])
        is_open = True
    forced, ordinal, key = bool(row.get("forced")), int(row["ordinal"]), str(row["key"])
    # the stored duration itself when there is one: ``end`` is rounded to the microsecond,
    # which can tip a duration on a unit's half the other way than ``kernelext show`` reads it
    took = duration_text(float(duration) if duration is not None else (end - start).total_seconds())
    title = _lines(
        f"{step_label(numbers.get(ordinal, ordinal), key)}: {status}"
        + (", forced" if forced else ""),
        took + (" so far" if status == StepStatus.RUNNING else " (end not known)" * is_open),
        f"started {clock(start)}",
        str(row.get("error") or ""),
    )
    return Bar(ordinal, key, status, start, end, forced, is_open, title)


def _tick(row: Mapping[str, Any], numbers: Mapping[int, int]) -> EffectTick:
    key, ordinal = row.get("step_key"), row.get("step_ordinal")
    shown = numbers.get(int(ordinal), int(ordinal)) if ordinal is not None else None
    where = "outside steps" if key == OUTSIDE_STEPS else step_label(shown, key)
    title = _lines(
        f"{row['tool']} [{where}] call {call_text(row['call_ordinal'])}: {row['status']}",
        f"intent {clock(row['intent_at'])}",
        f"outcome {clock(row['outcome_at'])}" if row.get("outcome_at") else "",
        f"decided by {row['decided_by']}" if row.get("decided_by") else "",
        str(row.get("error") or "")[:200],
        f"key {row['key']}",
    )
    tool, status, step_key = str(row["tool"]), str(row["status"]), str(row["step_key"])
    return EffectTick(tool, status, row["intent_at"], step_key, title)


@dataclass
class Timeline:
    """A run drawn on one time axis; displays as SVG. See :func:`timeline`. ``lanes``:
    the rows its step bars take (steps that ran at once each get one)."""

    run_id: str
    agent: str
    status: str
    now: dt.datetime
    bars: list[Bar]
    ticks: list[EffectTick]
    marks: list[Mark]
    spans: list[Span]
    idle_seconds: float = 60.0

    @classmethod
    def from_rows(
        cls,
        run: Mapping[str, Any],
        steps: Sequence[Mapping[str, Any]],
        effects: Sequence[Mapping[str, Any]],
        events: Sequence[Mapping[str, Any]],
        *,
        now: dt.datetime,
        idle_seconds: float = 60.0,
    ) -> Timeline:
        """Build from rows already read (``store.get_run``, ``store.steps``, the values of
        ``store.load_effects``, ``store.events``); ``now`` ends a step still running."""
        lease = run.get("lease_until")  # a live run's owner renews it: no news after it
        live = min(now, lease) if lease is not None else now
        numbers = step_numbers(steps)  # by cell or item, not by attempt
        ticks = sorted((_tick(row, numbers) for row in effects), key=lambda tick: tick.time)
        spans: list[Span] = []
        for event in events:
            if event.get("to_status") is not None:
                if spans:
                    spans[-1] = spans[-1]._replace(end=event["occurred_at"])
                at = event["occurred_at"]
                spans.append(Span(str(event["to_status"]), at, at, event.get("reason")))
        if spans and spans[-1].status in FINAL:
            spans.pop()
        elif spans:
            spans[-1] = spans[-1]._replace(end=max(spans[-1].start, live))
        return cls(
            str(run["id"]),
            str(run["agent"]),
            str(run["status"]),
            now,
            assign_lanes([_bar(row, effects, live, numbers) for row in steps]),
            ticks,
            [mark_of(event) for event in events],
            spans,
            idle_seconds,
        )

    @property
    def lanes(self) -> int:
        """Rows of step bars: the most steps that ran at once (at most ``MAX_LANES``)."""
        return max((bar.lane for bar in self.bars), default=0) + 1

    @property
    def folded(self) -> int:
        """Step attempts drawn over another in its row (more ran at once than rows)."""
        return sum(1 for bar in self.bars if bar.folded)

    @property
    def start(self) -> dt.datetime | None:
        """The earliest time drawn."""
        times = [b.start for b in self.bars] + [t.time for t in self.ticks]
        return min(times + [m.time for m in self.marks], default=None)

    def axis(self, x0: float = 0.0, width: float = 1000.0, gap_px: float = 36.0) -> TimeAxis:
        """The time axis of the picture (seconds from :attr:`start`)."""
        t0 = self.start or self.now
        moments = [(b.start, b.end) for b in self.bars] + [(t.time, t.time) for t in self.ticks]
        moments += [(m.time, m.time) for m in self.marks]
        activity = [((a - t0).total_seconds(), (b - t0).total_seconds()) for a, b in moments]
        longest = max(((b.end - b.start).total_seconds() for b in self.bars), default=0.0)
        threshold = max(self.idle_seconds, 3 * longest)
        return TimeAxis(activity, x0=x0, width=width, threshold=threshold, gap_px=gap_px)

    @property
    def gaps(self) -> list[Gap]:
        """The idle stretches cut out of the axis."""
        t0 = self.start or self.now
        at = [t0 + dt.timedelta(seconds=s) for gap in self.axis().gaps for s in gap]
        return [Gap(a, b) for a, b in zip(at[::2], at[1::2], strict=True)]

    def folded_on(self, axis: TimeAxis) -> Timeline:
        """This timeline as drawn on ``axis``: itself, or folded when it has too many
        shapes to draw one by one (``timeline_fold``)."""
        return fold(self, axis)

    @property
    def svg(self) -> str:
        """The full picture as an ``<svg>`` element (text)."""
        return self.render()

    def render(self, *, width: int = 900, compact: bool = False) -> str:
        """The picture as SVG; ``compact``: smaller, without labels or legend (the panel)."""
        return draw(self, width, compact)

    def html(self, *, width: int = 900, compact: bool = False) -> str:
        """The picture in ``<div class="kernelext-timeline">``."""
        svg = self.render(width=width, compact=compact)
        return f'<div class="kernelext-timeline" data-run-id="{esc(self.run_id)}">{svg}</div>'

    def _repr_html_(self) -> str:
        return self.html()

    def _repr_svg_(self) -> str:
        return self.svg

    @shows
    def text(self) -> str:
        """What the picture shows, in one line."""
        counts: dict[str, int] = {}
        for mark in self.marks:
            counts[mark.kind] = counts.get(mark.kind, 0) + 1
        forced = sum(1 for b in self.bars if b.forced)
        drawn = (
            f"{counted(len(self.bars), 'step attempt')} ({forced} forced), "
            f"{counted(len(self.ticks), 'effect')}"
        )
        if not self.bars and self.ticks:  # a run of model and tool calls
            drawn = counted(len(self.ticks), "call")
        line = f"timeline of run {self.run_id} [{self.agent}]: {self.status}, {drawn}"
        if self.lanes > 1:
            line += f"; up to {self.lanes} steps at once, one row each"
            if self.folded:
                line += f" ({self.folded} more folded into those rows)"
        line += "".join(f"; {n} {kind}" for kind, n in sorted(counts.items()))
        cut = ", ".join(duration_text(g.seconds) for g in self.gaps)
        line += f"; idle stretches cut from the axis: {cut}" if cut else ""
        return line + (f"; {note}" if (note := fold_note(self)) else "")

    @shows
    def __repr__(self) -> str:
        return self.text()

    def save(self, path: str) -> None:
        """Write the picture to an ``.svg`` file."""
        with open(path, "w", encoding="utf-8") as out:
            out.write('<?xml version="1.0" encoding="UTF-8"?>\n' + self.svg)


@validated("kx.timeline", run_id=RUN_ID, store=STORE, idle_seconds=check_duration)
def timeline(run_id: str, store: Store | None = None, *, idle_seconds: float = 60.0) -> Timeline:
    """The picture of run ``run_id`` on one time axis (reads the run, steps, effects, events).

    Show it in a cell; ``.svg`` is the SVG text and ``.save("run.svg")`` writes a file.
    Idle stretches longer than ``idle_seconds`` and than three times the longest step are
    cut out of the axis and labelled with their length.
    """
    store = get_store(store)
    run = store.get_run(run_id)
    effects = list(store.load_effects(run_id).values())
    steps, events = store.steps(run_id), store.events(run_id)
    return Timeline.from_rows(
        run, steps, effects, events, now=store.now(), idle_seconds=idle_seconds
    )
