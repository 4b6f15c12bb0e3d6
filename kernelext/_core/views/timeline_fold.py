"""A large timeline, folded: what a picture of 100,000 steps draws instead of each one.

A timeline draws one shape per step attempt, effect call and event: past ``MAX_SHAPES``
of them the picture would weigh megabytes (100,000 steps made 59 MB of HTML) and no one
could tell them apart. Then the time axis (idle stretches still cut) is split into
``COLUMNS`` columns and each column draws, per step status, one bar (rows: one per status,
not per step at once), per effect status one tick and per mark kind one mark; each shape's
hover text gives its count and time range. The totals (the header, ``Timeline.text()``)
count every step, effect and event, and say what was folded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from ..._formatting import counted
from ...status import StepStatus
from .timeline_axis import TimeAxis
from .timeline_svg import clock

if TYPE_CHECKING:
    from .timeline import Bar, EffectTick, Mark, Timeline

__all__ = ["COLUMNS", "MAX_SHAPES", "fold", "fold_note", "folds"]

MAX_SHAPES = 4000  # steps + effects + marks drawn one by one; past it they are folded
COLUMNS = 200  # the columns a folded picture groups its shapes into
# The rows of a folded picture, top to bottom (a status not listed goes under them).
STATUS_ROWS = (
    StepStatus.COMPLETED,
    StepStatus.RUNNING,
    StepStatus.FAILED,
    StepStatus.CANCELLED,
    StepStatus.ABANDONED,
)

T = TypeVar("T")


def folds(tl: Timeline) -> bool:
    """Whether ``tl`` has too many shapes to draw one by one."""
    return len(tl.bars) + len(tl.ticks) + len(tl.marks) > MAX_SHAPES


def fold_note(tl: Timeline) -> str:
    """What a folded picture did, for its text ("" when it draws every shape)."""
    if not folds(tl):
        return ""
    return (
        f"drawn folded ({counted(len(tl.bars) + len(tl.ticks) + len(tl.marks), 'shape')}, "
        f"more than {MAX_SHAPES:,}): steps, effects and marks grouped into {COLUMNS} "
        "columns of the time axis, one row per step status; hover a shape for its count"
    )


class _Column(NamedTuple):
    column: int
    kind: str


def _grouped(
    items: Iterable[T], column_of: Callable[[T], int], kind_of: Callable[[T], str]
) -> dict[_Column, list[T]]:
    groups: dict[_Column, list[T]] = {}
    for item in items:
        groups.setdefault(_Column(column_of(item), kind_of(item)), []).append(item)
    return groups


def _span(start: dt.datetime, end: dt.datetime) -> str:
    return clock(start) if start == end else f"{clock(start)} to {clock(end)}"


def fold(tl: Timeline, axis: TimeAxis) -> Timeline:
    """``tl`` itself when it draws every shape; else a copy whose bars, ticks and marks are
    one per column and status (or kind), on ``axis`` (the full timeline's)."""
    if not folds(tl):
        return tl
    t0 = tl.start or tl.now
    left, span = axis.left[0], max(axis.right_edge - axis.left[0], 1.0)

    def column(moment: dt.datetime) -> int:
        at = axis.x((moment - t0).total_seconds())
        return min(COLUMNS - 1, max(0, int((at - left) / span * COLUMNS)))

    return dataclasses.replace(
        tl,
        bars=_folded_bars(tl.bars, column),
        ticks=_folded_ticks(tl.ticks, column),
        marks=_folded_marks(tl.marks, column),
    )


def _folded_bars(bars: list[Bar], column: Callable[[dt.datetime], int]) -> list[Bar]:
    present = {bar.status for bar in bars}
    rows = [s for s in STATUS_ROWS if s in present] + sorted(present - set(STATUS_ROWS))
    out = []
    for (_col, status), group in sorted(_grouped(bars, lambda b: column(b.start), _status).items()):
        start, end = min(b.start for b in group), max(b.end for b in group)
        forced = sum(1 for b in group if b.forced)
        first = min(group, key=lambda b: b.ordinal)
        title = (
            f"{counted(len(group), 'step attempt')} {status}"
            + (f" ({forced} forced)" if forced else "")
            + f", {_span(start, end)}"
        )
        out.append(
            first._replace(
                key=f"{len(group):,}",
                start=start,
                end=end,
                forced=bool(forced),
                open=any(b.open for b in group),
                title=title,
                lane=rows.index(status),
                folded=len(group) > 1,
            )
        )
    return out


def _status(bar: Bar) -> str:
    return bar.status


def _folded_ticks(
    ticks: list[EffectTick], column: Callable[[dt.datetime], int]
) -> list[EffectTick]:
    out = []
    groups = _grouped(ticks, lambda t: column(t.time), lambda t: t.status)
    for (_col, status), group in sorted(groups.items()):
        tools = Counter(t.tool for t in group)
        named = ", ".join(f"{tool} ({n:,})" for tool, n in tools.most_common(5))
        more = f" and {len(tools) - 5} more tools" if len(tools) > 5 else ""
        when = _span(group[0].time, group[-1].time)
        title = f"{counted(len(group), 'effect call')} {status}, {when}: {named}{more}"
        out.append(group[0]._replace(title=title))
    return out


def _folded_marks(marks: list[Mark], column: Callable[[dt.datetime], int]) -> list[Mark]:
    out = []
    groups = _grouped(marks, lambda m: column(m.time), lambda m: m.kind)
    for (_col, _kind), group in sorted(groups.items()):
        if len(group) == 1:
            out.append(group[0])
            continue
        times = sorted(m.time for m in group)
        title = f"{len(group):,} × {group[0].label}, {_span(times[0], times[-1])}\n{group[0].title}"
        out.append(group[0]._replace(label=f"{group[0].label} ×{len(group):,}", title=title))
    return out
