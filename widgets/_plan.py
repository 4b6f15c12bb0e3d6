"""The resume plan in the control panel: what Resume would do, under the buttons.

``PlanPreview(handle)`` shows ``kx.plan(run_id)`` while the run waits (``suspended`` or
``needs_decision``) and nobody executes it, and hides otherwise. It sits under the panel's
buttons, collapsed to one line (its verdict) until opened, so the buttons never move.
The plan is computed again only when the run's status, reason or progress changed, or
the store reported a change of the run (a decision made elsewhere), so the panel's
redraws stay cheap. ``preview.plan`` is the plan on screen: the panel's Resume passes it to
``kx.resume(run_id, plan=...)``, which refuses if the run changed since it was shown.

:func:`plan_addon` is its control-panel add-on (installed by ``widgets/_addons.py``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import ipywidgets as w

from kernelext._core.plan.resume_plan import ResumePlan, plan
from kernelext._core.views.colours import WARN
from kernelext._shown import shown_html
from kernelext.status import WAITING

__all__ = ["PlanPreview", "plan_addon", "previewed_plan"]


class PlanPreview(w.VBox):
    """The plan of a waiting run, as HTML (hidden while the run runs or has ended), in a
    section collapsed by default (``preview.section.selected_index = 0`` opens it)."""

    def __init__(self, handle: Any, *, panel: Any = None) -> None:
        self.handle = handle
        self.panel = panel
        self.plan: ResumePlan | None = None
        self.body = w.HTML()
        self.section = w.Accordion(children=[self.body], titles=("Resume plan",))
        self.section.selected_index = None  # collapsed: one line under the buttons
        self._shown_for: Hashable = None
        super().__init__(children=[self.section], layout=w.Layout(margin="4px 0"))
        self.add_class("kernelext-plan-preview")
        self.refresh()

    def _state(self) -> tuple[Any, ...]:
        view = getattr(self.panel, "view", None)
        changes = getattr(self.panel, "store_changes", 0)
        if view is not None:
            return (view.status, view.reason, view.completed, changes, view.alive)
        info = self.handle.info()
        return (info["status"], info.get("reason"), info.get("completed_steps"), changes, False)

    def refresh(self, *, force: bool = False) -> ResumePlan | None:
        """Show the plan if the run waits; recompute it when the run changed (or ``force``)."""
        state = self._state()
        status, alive = state[0], state[-1]
        if alive or status not in WAITING:
            self.plan, self._shown_for = None, None
            self.layout.display = "none"
            self.body.value = ""
            return None
        if force or state != self._shown_for or self.plan is None:
            try:
                self.plan = plan(self.handle.run_id, self.handle.store)
            except Exception as exc:  # the panel keeps working; the reason is shown
                self.plan = None
                self.body.value = (
                    f"<div style='color:{WARN}'>resume plan unavailable: "
                    f"{shown_html(type(exc).__name__)}: {shown_html(str(exc))}</div>"
                )
            else:
                self.body.value = self.plan._repr_html_()
            self.section.set_title(0, _title(self.plan))
            self._shown_for = state
        self.layout.display = None
        return self.plan


def _title(shown: ResumePlan | None) -> str:
    """``Resume plan: Ready: a resume runs step 3 next.`` (the plan's verdict line)."""
    if shown is None:
        return "Resume plan"
    lines = shown.text().splitlines()
    return f"Resume plan: {lines[1].strip()}" if len(lines) > 1 else "Resume plan"


def plan_addon(panel: Any) -> PlanPreview:
    """A ``PANEL_ADDONS`` factory: the resume plan of the run the panel follows."""
    return PlanPreview(panel.handle, panel=panel)


def previewed_plan(panel: Any) -> ResumePlan | None:
    """The plan the panel shows now (for Resume to pass as ``plan=``), if any."""
    addons = getattr(panel, "addons", None)
    for child in getattr(addons, "children", ()):
        if isinstance(child, PlanPreview):
            return child.plan
    return None
