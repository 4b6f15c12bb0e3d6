"""A compact, live timeline of a run for its control panel (or shown on its own).

:class:`LiveTimeline` is a box of two ``HTML`` widgets: the stop estimate while a stop is
pending ("stops after step 7, in about 3.0 s"), and the compact picture of
``kernelext._core.views.timeline`` (the same SVG as ``kx.timeline(run_id)``, smaller, without
labels). The picture is read from the store again at most every ``interval`` seconds when
the run reports a step or an effect, and every ``tick`` seconds while it executes (so the
current bar grows), through a :class:`~.throttle.Throttle`; both grow by a second per
50 kB of picture, so a run of thousands of steps is not re-sent every two seconds. The
estimate line follows every redraw of the panel (during a ``run.map`` the panel's batch box
says how the stop drains instead). :func:`timeline_addon` is its control-panel
add-on (installed by ``widgets/_addons.py``).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from kernelext._core.engine.stop_estimate import StopEstimate, estimate_stop
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.views.colours import BAD, WARN
from kernelext._core.views.timeline import Timeline, timeline
from kernelext._shown import shown_html
from kernelext.status import Status

from ._throttle import Throttle

__all__ = ["LiveTimeline", "estimate_html", "timeline_addon"]


def estimate_html(estimate: StopEstimate | None) -> str:
    """The estimate line as HTML (empty when no stop is pending)."""
    if estimate is None:
        return ""
    colour = BAD if estimate.overrunning else WARN
    return (
        f'<div class="kernelext-stop-estimate" style="color:{colour}">'
        f"{shown_html(estimate.text)}</div>"
    )


class LiveTimeline(w.VBox):
    """The compact timeline of ``handle``'s run with the stop estimate above it.

    ``panel``: the control panel it sits on (its view spares a store read per redraw).
    ``refresh()`` updates the estimate now and asks for a new picture.
    """

    def __init__(
        self,
        handle: Any,
        *,
        panel: Any = None,
        width: int = 480,
        interval: float = 2.0,
        tick: float = 2.0,
    ) -> None:
        self.handle = handle
        self.panel = panel
        self.width = width
        self.interval, self.tick = interval, tick
        self.estimate = w.HTML()
        self.picture = w.HTML()
        self.timeline: Timeline | None = None
        self.stop_estimate: StopEstimate | None = None
        super().__init__(children=[self.estimate, self.picture])
        self.add_class("kernelext-timeline-live")
        self.throttle = Throttle(
            self._draw, interval=interval, tick=tick, active=lambda: bool(handle.alive)
        )
        self._run = engine_of(handle.run)
        self._run.listeners.append(self._on_run_event)
        self.throttle.refresh_now()

    def _on_run_event(self, what: str, value: Any) -> None:
        """From the run's worker thread: a new picture soon."""
        if self.panel is not None and self.panel.handle is not self.handle:
            self.detach()  # the panel follows another handle now (a resume)
            return
        self.throttle.poke()

    def refresh(self) -> None:
        """Update the estimate line now and the picture soon (the panel calls this on
        every redraw); at once when the panel shows another status than the picture."""
        self._draw_estimate()
        view = getattr(self.panel, "view", None)
        drawn = self.timeline.status if self.timeline is not None else None
        if view is not None and view.run_id == self.handle.run_id and view.status != drawn:
            self.throttle.refresh_now()  # a status change: never a stale picture beside it
        else:
            self.throttle.poke()

    def refresh_now(self) -> None:
        """Read the store and redraw both now."""
        self.throttle.refresh_now()

    def _draw_estimate(self) -> None:
        if self.handle.alive and engine_of(self.handle.run).batch is not None:
            # a batch drains its items in flight: the panel's batch box says so
            self.stop_estimate, self.estimate.value = None, ""
            return
        view = getattr(self.panel, "view", None)
        row = None
        if view is not None and view.run_id == self.handle.run_id:
            if view.status != Status.STOPPING:
                self.stop_estimate, self.estimate.value = None, ""
                return
            row = {"status": view.status, "max_step_seconds": view.max_step_seconds}
        current = engine_of(self.handle.run).current if self.handle.alive else None
        self.stop_estimate = estimate_stop(
            self.handle.run_id, self.handle.store, run=row, current=current
        )
        self.estimate.value = estimate_html(self.stop_estimate)

    def _draw(self) -> None:
        self._draw_estimate()
        self.timeline = timeline(self.handle.run_id, self.handle.store)
        picture = self.timeline.html(width=self.width, compact=True)
        if picture != self.picture.value:
            self.picture.value = picture
        # A large run's picture is read and sent less often: one more second per 50 kB.
        pace = len(picture) / 50_000
        self.throttle.interval = max(self.interval, pace)
        self.throttle.tick = max(self.tick, pace)

    def detach(self) -> None:
        """Stop following the run (the widgets stay as last drawn)."""
        self.throttle.close()
        if self._on_run_event in self._run.listeners:
            self._run.listeners.remove(self._on_run_event)


def timeline_addon(panel: Any) -> LiveTimeline:
    """A ``PANEL_ADDONS`` factory: the live timeline of the run the panel follows."""
    return LiveTimeline(panel.handle, panel=panel)
