"""What a :class:`~kernelext._core.views.timeline.Timeline` is drawn with as SVG: the elements, the
mark shapes, the styles and the layout of the lanes and rows.

:func:`~kernelext._core.views.timeline_draw.draw` turns a timeline into an ``<svg>`` element
(text) with them; the time axis it draws on is
:class:`~kernelext._core.views.timeline_axis.TimeAxis`. The colour of each step, effect and
status band comes from :mod:`kernelext._core.views.colours`; the shape of each mark is in the
table here.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._formatting import moment_text
from ..._shown import shown_html
from ...status import EffectStatus, Status, StepStatus
from .colours import (
    BAD,
    EFFECT_COLOURS,
    GREY,
    MUTED,
    OK,
    REQUEST_COLOURS,
    RUN_COLOURS,
    RUN_TINTS,
    STEP_COLOURS,
    THEME,
)
from .timeline_axis import TimeAxis

if TYPE_CHECKING:
    from .timeline import Timeline

__all__ = ["TimeAxis", "clock", "esc"]

SVG_NS = "http://www.w3.org/2000/svg"
RED, INK = BAD, MUTED
BANDS = RUN_TINTS
# mark kind -> (shape, colour). Kinds in ASKED (what the run asked a person) sit on the
# "asked" lane; the rest (stop requests too: they change the status) on the status band.
STYLE = {
    "start": ("line", INK),
    "end": ("line", "#24292f"),
    "stop_request": ("down", RUN_COLOURS[Status.STOPPING]),
    "force_request": ("down", RED),
    "forced": ("diamond", RED),
    "suspension": ("square", RUN_COLOURS[Status.SUSPENDED]),
    "resume": ("right", RUN_COLOURS[Status.RUNNING]),
    "decision_needed": ("circle", RUN_COLOURS[Status.NEEDS_DECISION]),
    "decision": ("circle", OK),
    "approval": ("circle", REQUEST_COLOURS["approval"]),
    "question": ("circle", REQUEST_COLOURS["question"]),
    "expiry": ("cross", INK),
    "overran": ("down", "#fb8f44"),
    "unknown_effect": ("circle", EFFECT_COLOURS[EffectStatus.UNKNOWN]),
    "swallowed": ("diamond", "#fb8f44"),
    "batch_start": ("line", RUN_COLOURS[Status.RUNNING]),
    "other": ("dot", GREY),
}
ASKED = frozenset({"decision", "approval", "question", "other"})
# Text follows the page's theme where CSS variables reach (inline in HTML); the attribute
# beside each is what a plain SVG viewer uses.
TEXT_STYLE = f"fill:{THEME['text']}"
INK_STYLE = f"fill:{THEME['muted']}"
FONT = 11.0  # px: no text in the picture is smaller
CHAR = 0.6 * FONT  # the width of a character, about


def esc(value: Any) -> str:
    """``value`` as text safe in XML and HTML: through the display door (control and
    invisible characters shown as escapes), then escaped for markup."""
    return shown_html(value)


def _el(tag: str, title: str | None = None, body: str = "", **attrs: Any) -> str:
    """An SVG element; ``data_kind=`` is written ``data-kind``, ``cls=`` ``class``."""
    parts = [tag]
    for name, value in attrs.items():
        text = f"{value:.1f}" if isinstance(value, float) else str(value)
        parts.append(f'{"class" if name == "cls" else name.replace("_", "-")}="{esc(text)}"')
    inner = (f"<title>{esc(title)}</title>" if title else "") + body
    return f"<{' '.join(parts)}>{inner}</{tag}>" if inner else f"<{' '.join(parts)}/>"


def clock(moment: dt.datetime) -> str:
    """``moment`` as ``YYYY-MM-DD HH:MM:SS.mmm UTC`` (hover text: steps are told apart by
    milliseconds)."""
    return moment_text(moment, precise=True)


# -- drawing -----------------------------------------------------------------------------------
class _Layout(NamedTuple):
    label_w: float  # the lane names' column
    font: float
    steps: tuple[float, float]  # top, height
    effects: tuple[float, float]
    asked_y: float  # centre of the "asked" marks
    band: tuple[float, float]  # the status band; the run's marks sit on it
    label_rows: tuple[float, ...]  # baselines of mark labels
    axis_y: float
    legend_y: float  # 0: none
    height: float
    r: float  # mark size


LEGEND_MARKS = (
    ("stop_request", "stop asked"),
    ("forced", "forced stop"),
    ("suspension", Status.SUSPENDED),
    ("resume", "resumed"),
    ("decision", "decision"),
    ("expiry", Status.EXPIRED),
)
FULL = _Layout(64, FONT, (26, 22), (54, 12), 78, (88, 20), (122, 135, 148), 158, 190, 198, 5)
COMPACT = _Layout(56, FONT, (20, 16), (40, 9), 58, (66, 14), (), 86, 0, 104, 4)
# Steps that ran at once get a row each: (the least row height, the most the rows take) px
LANE_ROOM = {False: (5.0, 160.0), True: (3.0, 96.0)}


def _with_lanes(lay: _Layout, lanes: int, compact: bool) -> tuple[_Layout, float]:
    """``lay`` with its steps band grown to ``lanes`` rows (everything under it moved
    down), and the height of one row."""
    top, single = lay.steps
    if lanes <= 1:
        return lay, single
    least, room = LANE_ROOM[compact]
    row = max(least, min(single, room / lanes))
    extra = row * lanes - single
    return (
        lay._replace(
            steps=(top, row * lanes),
            effects=(lay.effects[0] + extra, lay.effects[1]),
            asked_y=lay.asked_y + extra,
            band=(lay.band[0] + extra, lay.band[1]),
            label_rows=tuple(y + extra for y in lay.label_rows),
            axis_y=lay.axis_y + extra,
            legend_y=lay.legend_y + extra if lay.legend_y else 0,
            height=lay.height + extra,
        ),
        row,
    )


LEGEND = (
    ("rect", STEP_COLOURS[StepStatus.COMPLETED], f"step {StepStatus.COMPLETED}"),
    ("rect", GREY, StepStatus.CANCELLED),
    ("forced", RED, "forced"),
    ("tick", EFFECT_COLOURS[EffectStatus.APPLIED], f"effect {EffectStatus.APPLIED}"),
    ("tick", EFFECT_COLOURS[EffectStatus.UNKNOWN], EffectStatus.UNKNOWN),
    *((*STYLE[kind], label) for kind, label in LEGEND_MARKS),
)


def _legend(tl: Timeline) -> list[tuple[str, str, str]]:
    """The legend's entries for what the picture shows (nothing that did not occur)."""
    steps = {bar.status for bar in tl.bars}
    effects = {tick.status for tick in tl.ticks}
    marks = {mark.kind for mark in tl.marks}
    shown = {
        f"step {StepStatus.COMPLETED}": StepStatus.COMPLETED in steps,
        StepStatus.CANCELLED: StepStatus.CANCELLED in steps,
        "forced": any(bar.forced for bar in tl.bars),
        f"effect {EffectStatus.APPLIED}": EffectStatus.APPLIED in effects,
        EffectStatus.UNKNOWN: EffectStatus.UNKNOWN in effects,
    }
    shown.update({label: kind in marks for kind, label in LEGEND_MARKS})
    return [entry for entry in LEGEND if shown.get(entry[2], False)]


def _glyph(shape: str, x: float, y: float, r: float, colour: str) -> str:
    if shape in ("circle", "dot"):
        return _el("circle", cx=x, cy=y, r=r * (0.6 if shape == "dot" else 1.0), fill=colour)
    if shape == "tick":
        return _el("path", d=f"M{x:.1f},{y - r:.1f}V{y + r:.1f}", stroke=colour, stroke_width=2)
    a, b, c, d = x - r, x + r, y - r, y + r
    path = {
        "down": f"M{a:.1f},{c:.1f}L{b:.1f},{c:.1f}L{x:.1f},{d:.1f}Z",
        "right": f"M{a:.1f},{c:.1f}L{b:.1f},{y:.1f}L{a:.1f},{d:.1f}Z",
        "square": f"M{a:.1f},{c:.1f}H{b:.1f}V{d:.1f}H{a:.1f}Z",
        "diamond": f"M{x:.1f},{c:.1f}L{b:.1f},{y:.1f}L{x:.1f},{d:.1f}L{a:.1f},{y:.1f}Z",
        "cross": f"M{a:.1f},{c:.1f}L{b:.1f},{d:.1f}M{b:.1f},{c:.1f}L{a:.1f},{d:.1f}",
        "line": f"M{x:.1f},{c - 3:.1f}V{d + 3:.1f}",
    }[shape]
    if shape in ("cross", "line"):
        return _el("path", d=path, fill="none", stroke=colour, stroke_width=2)
    return _el("path", d=path, fill=colour)
