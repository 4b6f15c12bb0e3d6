"""The overview of the runs as HTML: each cell of a row, and the whole static table.

The live overview (``_runs.py``) puts :func:`cells` into its grid, one HTML widget a
cell; :func:`overview_html` is the same rows as one ``<table>``: the ``text/html`` of
``kx.runs()`` in a notebook, and the saved copy a notebook keeps once its kernel is gone.
Colours come from ``colours.RUN_COLOURS`` (the badge the panel shows).
"""

from __future__ import annotations

from kernelext._core.lifecycle.overview import Overview, RunRow
from kernelext._core.views.colours import BAD, RUN_COLOURS, THEME, colour_of
from kernelext._formatting import moment_text
from kernelext._shown import shown_html
from kernelext.status import Status

from ._render import status_badge
from ._static import hide_style

__all__ = ["COLUMNS", "cells", "header_html", "overview_html", "saved_overview_html"]

COLUMNS = ("run", "status", "progress", "time left", "waits for")
LIVE = ".kernelext-runs.widget-box:not(.jupyter-widgets-disconnected)"
SAVED = ".kernelext-runs-saved"


def _muted(text: str, *, title: str | None = None) -> str:
    tip = f' title="{shown_html(title)}"' if title else ""
    return f'<span style="color:{THEME["muted"]}"{tip}>{shown_html(text)}</span>'


def run_html(row: RunRow) -> str:
    return f"<code>{shown_html(row.run_id)}</code> {_muted(f'[{row.agent}]')}"


def status_html(row: RunRow) -> str:
    badge = status_badge(row.status)
    tip = row.reason or ""
    if row.stop_pending:
        source = row.stop_pending.rsplit("(", 1)[-1].rstrip(")")
        pending = (
            f'<div class="kernelext-row-stop" style="font-size:11px;color:'
            f'{RUN_COLOURS[Status.STOPPING]}" title="{shown_html(row.stop_pending)}">'
            f"stop pending ({shown_html(source)})</div>"
        )
        return f'<span title="{shown_html(tip)}">{badge}</span>{pending}'
    return f'<span title="{shown_html(tip)}">{badge}</span>'


def progress_html(row: RunRow) -> str:
    text = shown_html(row.progress)
    if row.fraction is None:
        return f"<div>{text}</div>"
    width = max(0.0, min(1.0, row.fraction)) * 100
    colour = colour_of(RUN_COLOURS, row.status)
    bar = (
        f'<div style="width:110px;height:5px;background:{THEME["border"]};border-radius:3px">'
        f'<div style="width:{width:.0f}%;height:5px;background:{colour};border-radius:3px">'
        "</div></div>"
    )
    return f"<div>{text}</div>{bar}"


def left_html(row: RunRow) -> str:
    return f"<div>{shown_html(row.time_left)}</div>" if row.time_left else _muted("—")


def waits_html(row: RunRow) -> str:
    if row.gone:  # its process is gone: what to do about it
        text = shown_html(row.gone)
        return f'<div class="kernelext-row-gone" style="color:{BAD}">{text}</div>'
    if not row.waits_for:
        return _muted("—")
    colour = colour_of(RUN_COLOURS, row.status)
    text = shown_html(row.waits_for)
    return f'<div class="kernelext-row-waits" style="color:{colour}">{text}</div>'


def cells(row: RunRow) -> tuple[str, str, str, str, str]:
    """The row's cells, in the order of :data:`COLUMNS`."""
    return run_html(row), status_html(row), progress_html(row), left_html(row), waits_html(row)


def header_html(overview: Overview, where: str) -> str:
    """``runs in <store> · 7 runs: 2 running, ... · read 12:00:05 UTC``."""
    return (
        f"<div><b>runs</b> in <code>{shown_html(where)}</code> "
        f"{_muted('· ' + overview.summary())} "
        f"{_muted('· read ' + moment_text(overview.now))}</div>"
    )


def overview_html(overview: Overview, where: str, *, static: bool = True) -> str:
    """The overview as one table (no buttons): the static fallback."""
    head = "".join(f"<th>{shown_html(name)}</th>" for name in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells(row)) + "</tr>"
        for row in overview.rows
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    note = ""
    if static:
        note = (
            f'<div style="color:{THEME["muted"]};font-size:11px">static snapshot; with a '
            "running kernel, <code>kx.runs()</code> (after <code>%load_ext kernelext</code>) "
            "shows it live</div>"
        )
    return (
        f'<div class="kernelext-runs kernelext-static" style="border:1px solid '
        f"{THEME['border']};border-radius:6px;padding:6px 10px;color:{THEME['text']};"
        f'font-family:{THEME["font"]};font-size:{THEME["size"]}">'
        f"{header_html(overview, where)}{table if overview.rows else ''}{note}</div>"
    )


def saved_overview_html(overview: Overview, where: str) -> str:
    """The saved copy shown beside the live overview (hidden while the widget renders)."""
    return (
        f'<div class="kernelext-runs-saved">{hide_style(LIVE, SAVED)}'
        f"{overview_html(overview, where)}</div>"
    )
