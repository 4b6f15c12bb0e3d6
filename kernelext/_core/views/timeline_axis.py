"""The time axis of a run's timeline: seconds from the run's start to x, idle stretches cut.

:class:`TimeAxis` merges what is drawn into segments, gives each a width in proportion to
its length and draws each idle stretch longer than a threshold as a fixed-width break;
:meth:`TimeAxis.ticks` places the axis ticks at round steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["NICE_STEPS", "TimeAxis"]

NICE_STEPS = (
    *(m * 10.0**e for e in range(-3, 2) for m in (1, 2, 5)),
    *(60.0 * m for m in (2, 5, 10, 15, 30, 60, 120, 360, 720)),
    *(86400.0 * m for m in (1, 2, 7, 14, 30)),
)


class TimeAxis:
    """Maps seconds (from the start) to x, cutting idle stretches longer than ``threshold``.

    ``activity`` are (start, end) intervals with something drawn. They are merged into
    segments where they are at most ``threshold`` apart; each segment gets a width in
    proportion to its length (at least ``min_px``), each cut stretch ``gap_px``.
    """

    def __init__(
        self,
        activity: Sequence[tuple[float, float]],
        *,
        x0: float,
        width: float,
        threshold: float,
        gap_px: float = 36.0,
        min_px: float = 14.0,
        pad: float = 6.0,
    ) -> None:
        merged: list[list[float]] = []
        for start, end in sorted(activity):
            if merged and start - merged[-1][1] <= threshold:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.segments = [(s, e) for s, e in merged] or [(0.0, 0.0)]
        self.gaps = [(a[1], b[0]) for a, b in zip(self.segments, self.segments[1:], strict=False)]
        self.gap_px = min(gap_px, width * 0.4 / len(self.gaps)) if self.gaps else gap_px
        self.pad = pad
        lengths = [e - s for s, e in self.segments]
        self.px = _allocate(lengths, width - self.gap_px * len(self.gaps), min_px)
        self.left = [x0 + sum(self.px[:i]) + self.gap_px * i for i in range(len(self.px))]
        self.right_edge = self.left[-1] + self.px[-1]

    def x(self, t: float) -> float:
        """The x of time ``t``; a time in a cut stretch falls inside its break."""
        for i, (start, end) in enumerate(self.segments):
            if t < start and i > 0:
                gap_start = self.segments[i - 1][1]
                return self.left[i] - self.gap_px * (start - t) / (start - gap_start)
            if t <= end or i == len(self.segments) - 1:
                if end <= start:
                    return self.left[i] + self.px[i] / 2
                frac = min(max((t - start) / (end - start), 0.0), 1.0)
                return self.left[i] + self.pad + (self.px[i] - 2 * self.pad) * frac
        return self.left[0]  # no segment: unreachable, segments is never empty

    def ticks(self, min_spacing: float) -> list[tuple[float, float, float]]:
        """(seconds, x, step) of axis ticks, ``min_spacing`` px apart within a segment."""
        out: list[tuple[float, float, float]] = []
        for i, (start, end) in enumerate(self.segments):
            per_s = (self.px[i] - 2 * self.pad) / (end - start) if end > start else 0.0
            if per_s <= 0:
                out.append((start, self.x(start), 1.0))
                continue
            step = next((s for s in NICE_STEPS if s * per_s >= min_spacing), NICE_STEPS[-1])
            t = math.ceil(start / step - 1e-9) * step
            while t <= end + 1e-9:
                out.append((t, self.x(t), step))
                t += step
        return out


def _allocate(lengths: Sequence[float], room: float, minimum: float) -> list[float]:
    """Widths in proportion to ``lengths``, summing to ``room``, none below ``minimum``."""
    n, fixed = len(lengths), set[int]()
    if room <= minimum * n:
        return [room / n] * n
    while True:
        free = [i for i in range(n) if i not in fixed]
        left, total = room - minimum * len(fixed), sum(lengths[i] for i in free)
        share = {i: left * lengths[i] / total if total > 0 else left / len(free) for i in free}
        small = {i for i in free if share[i] < minimum}
        if not small or len(small) == len(free):
            return [share.get(i, minimum) for i in range(n)]
        fixed |= small
