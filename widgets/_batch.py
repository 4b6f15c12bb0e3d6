"""A batch (``run.map``) on the control panel: one bar and one line.

The bar shows the batch's items in four parts, left to right: done, failed, waiting for a
person, in flight (the rest of the track is the items not started). The line under it is
the batch's :attr:`~kernelext._core.batch.view.BatchCounts.text` ("batch: 120/400 done,
16 in flight, 35 items/s, about 8 s left"); after a stop, the drain ("stopping: 12 items in
flight, about 3 s") is its own line. Elements carry classes a page can find:

- ``kx-batch`` (the box; ``data-total``, ``data-done``, ``data-in-flight``, ``data-failed``,
  ``data-waiting`` and ``data-state``: ``running``, ``stopping`` or ``ended``),
- ``kx-batch-progress`` (the bar, ``role="progressbar"``) holding ``kx-batch-done``,
  ``kx-batch-failed``, ``kx-batch-waiting`` and ``kx-batch-in-flight``,
- ``kx-batch-text`` (the line) and ``kx-batch-drain`` (the drain, while stopping).
"""

from __future__ import annotations

from kernelext._core.batch.view import BatchCounts
from kernelext._core.views.colours import BATCH_COLOURS, BORDER, MUTED, RUN_COLOURS
from kernelext._shown import shown_html
from kernelext.status import Status, StepStatus

__all__ = ["BATCH_PARTS", "batch_html", "batch_state"]

# (class suffix, count field) in the order the bar draws them
BATCH_PARTS = (
    ("done", "done"),
    (StepStatus.FAILED, StepStatus.FAILED),
    ("waiting", "waiting"),
    ("in-flight", "in_flight"),
)


def batch_state(counts: BatchCounts) -> str:
    """``running``, ``stopping`` or ``ended``."""
    if counts.ended:
        return "ended"
    return Status.STOPPING if counts.stopping else Status.RUNNING


def batch_html(counts: BatchCounts | None, *, width: str = "60%") -> str:
    """The batch box as HTML (empty without a batch); inline styles only."""
    if counts is None:
        return ""
    total = max(counts.total, 1)
    segments = []
    for suffix, name in BATCH_PARTS:
        count = int(getattr(counts, name))
        colour = BATCH_COLOURS[name]
        segments.append(
            f'<div class="kx-batch-{suffix}" data-count="{count}" title="{count} '
            f'{shown_html(suffix.replace("-", " "))}" style="width:{100 * count / total:.2f}%;'
            f'background:{colour};height:100%"></div>'
        )
    state = batch_state(counts)
    bar = (
        f'<div class="kx-batch-progress" role="progressbar" aria-valuemin="0" '
        f'aria-valuemax="{counts.total}" aria-valuenow="{counts.done}" '
        f'aria-label="{shown_html(counts.counts_text())}" style="display:flex;width:{width};'
        f'height:10px;background:{BORDER};border-radius:4px;overflow:hidden;margin:3px 0">'
        f"{''.join(segments)}</div>"
    )
    if counts.stopping and not counts.ended:
        line = shown_html(counts.progress_text(in_flight=False))
        drain = (
            f'<div class="kx-batch-drain" style="color:{RUN_COLOURS[Status.STOPPING]};'
            f'font-weight:600">{shown_html(counts.drain_text())}</div>'
        )
    else:
        line, drain = shown_html(counts.text), ""
    colour = MUTED if counts.ended else "inherit"
    return (
        f'<div class="kx-batch" data-state="{state}" data-total="{counts.total}" '
        f'data-done="{counts.done}" data-in-flight="{counts.in_flight}" '
        f'data-failed="{counts.failed}" data-waiting="{counts.waiting}">{bar}'
        f'<div class="kx-batch-text" style="color:{colour}">{line}</div>{drain}</div>'
    )
