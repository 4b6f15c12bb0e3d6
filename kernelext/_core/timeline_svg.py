"""Drawing a :class:`~kernelext._core.timeline.Timeline` as SVG: the lanes, the rows of steps
that ran at once, the marks and the legend.

:func:`draw` turns a timeline into an ``<svg>`` element (text); the time axis it draws on
is :class:`~kernelext._core.timeline_axis.TimeAxis`. The colour of each step, effect and
status band comes from :mod:`kernelext._core.colours`; the shape of each mark is in the
table here.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any, NamedTuple

from .._formatting import counted, duration_text, moment_text
from .._shown import shown_html
from ..status import EffectStatus, Status, StepStatus
from .colours import (
    BAD,
    EFFECT_COLOURS,
    GREY,
    MUTED,
    OK,
    PAPER,
    REQUEST_COLOURS,
    RUN_COLOURS,
    RUN_TINTS,
    STEP_COLOURS,
    THEME,
)
from .timeline_axis import TimeAxis

if TYPE_CHECKING:
    from .timeline import Timeline

__all__ = ["TimeAxis", "clock", "draw", "esc"]

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


def draw(tl: Timeline, width: int, compact: bool) -> str:
    """``tl`` as an ``<svg>`` element ``width`` px wide; ``compact``: no labels or legend."""
    base = COMPACT if compact else FULL
    left, right = base.label_w, width - 10.0
    axis = tl.axis(left, right - left, 24.0 if compact else 36.0)
    full, tl = tl, tl.folded_on(axis)  # the totals from full, the shapes from tl
    lay, row_h = _with_lanes(base, tl.lanes, compact)
    summary, t0 = full.text(), full.start or full.now

    def x(moment: dt.datetime) -> float:
        return axis.x((moment - t0).total_seconds())

    stepless = not tl.bars and bool(tl.ticks)  # a run of model and tool calls
    counts = counted(len(full.bars), "step attempt")  # a step run again counts again
    counts = counted(len(full.ticks), "call") if stepless else counts
    head = f"run {tl.run_id} · {tl.agent} · {tl.status} · {counts}"
    if not compact:
        head += ("" if stepless else f" · {counted(len(full.ticks), 'effect')}") + (
            f" · from {moment_text(t0)}"
        )
    out = [
        _el(
            "rect",
            cls="kx-bg",
            width=width,
            height=lay.height,
            fill="#ffffff",
            style=f"fill:{THEME['paper']}",
        ),
        _el(
            "text",
            body=esc(head),
            cls="kx-header",
            x=4,
            y=lay.font + 3,
            font_weight=600,
            fill="#1f2328",
            style=TEXT_STYLE,
        ),
    ]
    lanes = {"steps": lay.steps[0] + lay.steps[1] / 2, "effects": sum(lay.effects) - 2}
    lanes.update(asked=lay.asked_y + 3, status=lay.band[0] + lay.band[1] / 2 + 3)
    out += [
        _el("text", body=name, cls="kx-lane", x=4, y=y, fill=INK, style=INK_STYLE)
        for name, y in lanes.items()
    ]
    if tl.lanes > 1 and not compact:
        rows = f"{tl.lanes} rows" + (f", +{tl.folded}" if tl.folded else "")
        rows = "folded" if full is not tl else rows
        out.append(
            _el(
                "text",
                body=rows,
                cls="kx-lanes",
                x=4,
                y=lanes["steps"] + FONT + 2,
                fill=INK,
                style=INK_STYLE,
            )
        )
    taken: list[tuple[float, float]] = []  # extents of the axis labels drawn
    top, bottom = lay.steps[0], lay.axis_y
    for (a, b), gap in zip(axis.gaps, full.gaps, strict=True):
        x1, x2 = axis.x(a), axis.x(b)
        mid, z, label = (x1 + x2) / 2, (x2 - x1) / 4, duration_text(gap.seconds)
        title = f"idle {duration_text(gap.seconds)}, not to scale: {clock(gap.start)} to "
        zigzag = (
            f"M{mid - z:.1f},{top}L{mid + z:.1f},{(top + bottom) / 2:.1f}L{mid - z:.1f},{bottom}"
        )
        body = _el("rect", x=x1, y=top, width=x2 - x1, height=bottom - top, fill=PAPER)
        body += _el("path", d=zigzag, fill="none", stroke="#afb8c1", stroke_dasharray="3 2")
        body += _el(
            "text",
            body=esc(label),
            x=mid,
            y=bottom + lay.font + 2,
            fill=INK,
            style=INK_STYLE,
            text_anchor="middle",
        )
        out.append(_el("g", title + clock(gap.end), body, cls="kx-gap", data_seconds=gap.seconds))
        taken.append((mid - len(label) * CHAR / 2, mid + len(label) * CHAR / 2))
    for span in tl.spans:
        if span.status in BANDS:
            took = f"{span.status} for {duration_text((span.end - span.start).total_seconds())}"
            title = took + (f" ({span.reason})" if span.reason else "")
            x1, y1, h1 = x(span.start), *lay.band
            out.append(
                _el(
                    "rect",
                    title,
                    cls="kx-status",
                    data_status=span.status,
                    x=x1,
                    y=y1,
                    width=max(x(span.end) - x1, 1.0),
                    height=h1,
                    fill=BANDS[span.status],
                )
            )
    row_gap = 1.0 if tl.lanes > 1 else 0.0  # between rows
    for bar in tl.bars:
        x1, y1, h1 = x(bar.start), lay.steps[0] + bar.lane * row_h, row_h - row_gap
        w1 = max(x(bar.end) - x1, 2.0)
        look: dict[str, Any] = {"stroke": RED, "stroke_width": 2} if bar.forced else {}
        # a thin white edge between adjacent bars (thin rows: their gap is the edge)
        look.setdefault("stroke", "#ffffff" if h1 >= 8 else "none")
        if bar.open:
            look.update(fill_opacity=0.55, stroke_dasharray="3 2")
        out.append(
            _el(
                "rect",
                bar.title,
                cls="kx-step kx-forced" if bar.forced else "kx-step",
                data_ordinal=bar.ordinal,
                data_key=bar.key,
                data_status=bar.status,
                data_forced=str(bar.forced).lower(),
                data_lane=bar.lane,
                **({"data_folded": "true"} if bar.folded else {}),
                x=x1,
                y=y1,
                width=w1,
                height=h1,
                fill=STEP_COLOURS.get(bar.status, GREY),
                **look,
            )
        )
        if not compact and h1 >= 12 and w1 >= CHAR * len(bar.key) + 4:
            out.append(
                _el(
                    "text",
                    body=esc(bar.key),
                    cls="kx-step-label",
                    x=x1 + w1 / 2,
                    y=y1 + h1 / 2 + 3,
                    text_anchor="middle",
                    fill="#ffffff",
                )
            )
    for tick in sorted(tl.ticks, key=lambda t: t.status != EffectStatus.APPLIED):
        xt, (y1, h1) = x(tick.time), lay.effects
        out.append(
            _el(
                "line",
                tick.title,
                cls="kx-effect",
                data_status=tick.status,
                data_tool=tick.tool,
                x1=xt,
                x2=xt,
                y1=y1,
                y2=y1 + h1,
                stroke=EFFECT_COLOURS.get(tick.status, GREY),
                stroke_width=2,
            )
        )
    rows_right = [-math.inf] * len(lay.label_rows)
    for mark in sorted(tl.marks, key=lambda m: m.time):
        shape, colour = STYLE.get(mark.kind, STYLE["other"])
        xm = x(mark.time)
        ym = lay.asked_y if mark.kind in ASKED else lay.band[0] + lay.band[1] / 2
        glyph = _glyph(shape, xm, ym, lay.r, colour)
        out.append(
            _el(
                "g",
                mark.title,
                glyph,
                cls="kx-mark",
                data_kind=mark.kind,
                data_time=mark.time.isoformat(),
            )
        )
        half = len(mark.label) * CHAR / 2
        xm = min(max(xm, half + 2), width - half - 2)  # the label stays inside the picture
        free = [i for i, edge in enumerate(rows_right) if xm - half > edge + 4]
        if free and mark.kind != "other":
            rows_right[free[0]] = xm + half
            out.append(
                _el(
                    "text",
                    body=esc(mark.label),
                    cls="kx-mark-label",
                    x=xm,
                    y=lay.label_rows[free[0]],
                    text_anchor="middle",
                    fill=colour,
                )
            )
    ay = lay.axis_y
    out.append(_el("line", x1=left, x2=axis.right_edge, y1=ay, y2=ay, stroke=INK))
    for seconds, xt, _step in axis.ticks(56.0 if compact else 70.0):
        label = duration_text(seconds)
        a, b = xt - len(label) * CHAR / 2, xt + len(label) * CHAR / 2
        out.append(_el("line", x1=xt, x2=xt, y1=ay, y2=ay + 4, stroke=INK))
        if b <= right + 8 and all(b < c or a > d for c, d in taken):
            taken.append((a, b))
            out.append(
                _el(
                    "text",
                    body=esc(label),
                    cls="kx-axis",
                    x=xt,
                    y=ay + lay.font + 2,
                    text_anchor="middle",
                    fill=INK,
                    style=INK_STYLE,
                )
            )
    xl = 4.0
    for shape, colour, label in _legend(tl) if lay.legend_y else ():
        if xl + 14 + len(label) * CHAR > width:
            break
        y = lay.legend_y
        if shape in ("rect", "forced"):
            fill, edge = ("#ffffff", 2) if shape == "forced" else (colour, 0)
            out.append(
                _el(
                    "rect",
                    x=xl,
                    y=y - 7,
                    width=10,
                    height=8,
                    fill=fill,
                    stroke=colour,
                    stroke_width=edge,
                )
            )
        else:
            out.append(_glyph(shape, xl + 5, y - 3, 4, colour))
        text = esc(label)
        out.append(
            _el("text", body=text, cls="kx-legend", x=xl + 13, y=y, fill=INK, style=INK_STYLE)
        )
        xl += 24 + len(label) * CHAR
    return _el(
        "svg",
        summary,
        "".join(out),
        xmlns=SVG_NS,
        cls="kx-timeline",
        data_lanes=tl.lanes,
        width=width,
        height=lay.height,
        viewBox=f"0 0 {width} {lay.height:g}",
        font_family="sans-serif",
        font_size=lay.font,
        role="img",
        aria_label=summary,
        style="max-width:100%;height:auto",
    )
