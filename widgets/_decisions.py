"""The decision widgets inside a run's control panel, and the run going on from there.

A run in ``needs_decision`` shows, in its panel's decision slot:

- the reconciliation widget while effects of the run have an unknown outcome (these
  are decided first: a resume stops for them before any fact is re-checked). Once
  the last one is decided ("It happened" or "It did not happen — retry"), the panel
  resumes the run itself, as its Resume button would;
- the revalidation widget when recorded facts are contradicted. "Accept and
  continue" and "Re-plan from step" resume the run; the panel then follows the new
  run. "Abort run" cancels it and the panel says so.

:func:`reconciliation_for_panel` and :func:`revalidation_for_panel` are the factories
``widgets/_addons.py`` puts in ``NEEDS_DECISION_WIDGETS``.
:func:`decision_widget` returns the widget a panel shows, to drive it from code
(``decision_widget(panel).accept_button.click()``). Imports the core only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelext._core.people.reconcile import GIVE_UP

from ._reconcile import ReconcileWidget, reconcile_for_handle
from ._revalidation import RevalidationWidget, revalidation_for_handle

if TYPE_CHECKING:
    from ._panel import ControlPanel

__all__ = [
    "decision_widget",
    "reconciliation_for_panel",
    "revalidation_for_panel",
]


def reconciliation_for_panel(panel: ControlPanel) -> ReconcileWidget | None:
    """The reconciliation widget for the panel's run (None without open unknowns)."""
    made: list[ReconcileWidget] = []

    def decided(_item: Any) -> None:
        rec = made[0].rec
        if rec.open or any(item.decision == GIVE_UP for item in rec):
            panel.refresh()  # more to decide, or the run was given up (cancelled)
            return
        panel.resume_button.click()  # everything decided: the run goes on, same panel

    widget = reconcile_for_handle(panel.handle, on_decided=decided)
    if widget is not None:
        made.append(widget)
    return widget


def revalidation_for_panel(panel: ControlPanel) -> RevalidationWidget | None:
    """The revalidation widget for the panel's run (None unless facts are contradicted)."""

    def decided(handle: Any) -> None:
        if handle is not None:  # accepted or re-planned: the run resumed
            panel.follow(handle)
        panel.refresh()

    return revalidation_for_handle(panel.handle, on_decided=decided)


def decision_widget(panel: ControlPanel) -> ReconcileWidget | RevalidationWidget | None:
    """The decision widget the panel shows now (after a redraw), or None."""
    panel.refresh()
    for child in panel.decision_slot.children:
        if isinstance(child, (ReconcileWidget, RevalidationWidget)):
            return child
    return None
