"""Drawing a :class:`~kernelext._core.views.timeline.Timeline` as SVG, layer by layer: the header,
the lanes' names, the idle gaps, the status band, the rows of steps, the effect ticks, the
marks, the time axis and the legend. The elements, shapes, styles and layout they use are
in :mod:`kernelext._core.views.timeline_svg`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._formatting import counted, duration_text, moment_text
from ...status import EffectStatus
from .colours import EFFECT_COLOURS, GREY, PAPER, STEP_COLOURS, THEME
from .timeline_axis import TimeAxis
from .timeline_svg import (
    ASKED,
    BANDS,
    CHAR,
    COMPACT,
    FONT,
    FULL,
    INK,
    INK_STYLE,
    RED,
    STYLE,
    SVG_NS,
    TEXT_STYLE,
    _el,
    _glyph,
    _Layout,
    _legend,
    _with_lanes,
    clock,
    esc,
)

if TYPE_CHECKING:
    from .timeline import Timeline

__all__ = ["draw"]


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

    out = _header(tl, full, lay, width, t0, compact)
    out += _lane_names(tl, full, lay, compact)
    taken: list[tuple[float, float]] = []  # extents of the axis labels drawn
    out += _gaps(axis, full, lay, taken)
    out += _status_bands(tl, lay, x)
    out += _step_rows(tl, lay, row_h, x, compact)
    out += _effect_ticks(tl, lay, x)
    out += _marks(tl, lay, x, width)
    out += _axis(axis, lay, left, right, compact, taken)
    out += _legend_row(tl, lay, width)
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


def _header(
    tl: Timeline, full: Timeline, lay: _Layout, width: int, t0: dt.datetime, compact: bool
) -> list[str]:
    """The background and the header line: the run, its status and its counts."""
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
    return out


def _lane_names(tl: Timeline, full: Timeline, lay: _Layout, compact: bool) -> list[str]:
    """The lanes' names on the left (steps, effects, asked, status), and the rows' count."""
    out: list[str] = []
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
    return out


def _gaps(
    axis: TimeAxis, full: Timeline, lay: _Layout, taken: list[tuple[float, float]]
) -> list[str]:
    """The idle gaps cut out of the axis; their labels' extents go into ``taken``."""
    out: list[str] = []
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
    return out


def _status_bands(tl: Timeline, lay: _Layout, x: Callable[[dt.datetime], float]) -> list[str]:
    """The run's status band: a tinted span for each status in ``BANDS``."""
    out: list[str] = []
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
    return out


def _step_rows(
    tl: Timeline, lay: _Layout, row_h: float, x: Callable[[dt.datetime], float], compact: bool
) -> list[str]:
    """A bar per step attempt, on its row (steps that ran at once get a row each)."""
    out: list[str] = []
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
    return out


def _effect_ticks(tl: Timeline, lay: _Layout, x: Callable[[dt.datetime], float]) -> list[str]:
    """A tick per effect call, the applied ones first (the others drawn over them)."""
    out: list[str] = []
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
    return out


def _marks(tl: Timeline, lay: _Layout, x: Callable[[dt.datetime], float], width: int) -> list[str]:
    """The run's marks (stops, suspensions, decisions...) and their labels, on rows that
    do not overlap."""
    out: list[str] = []
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
    return out


def _axis(
    axis: TimeAxis,
    lay: _Layout,
    left: float,
    right: float,
    compact: bool,
    taken: list[tuple[float, float]],
) -> list[str]:
    """The time axis: its line, ticks and the labels that fit beside those in ``taken``."""
    out: list[str] = []
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
    return out


def _legend_row(tl: Timeline, lay: _Layout, width: int) -> list[str]:
    """The legend: what the picture shows, as far as the width allows."""
    out: list[str] = []
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
    return out
