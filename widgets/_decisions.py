"""The decision widgets inside a run's control panel, and the run going on from there.

A run in ``needs_decision`` shows, in its panel's decision slot:

- the reconciliation widget while effects of the run have an unknown outcome (these
  are decided first: a resume stops for them before any fact is re-checked). Once
  the last one is decided ("It happened" or "It did not happen — retry"), the panel
  resumes the run itself, as its Resume button would;
- the revalidation widget when recorded facts are contradicted. "Accept and
  continue" and "Re-plan from step" resume the run; the panel then follows the new
  run. "Abort run" cancels it and the panel says so.

:func:`install` registers both in ``NEEDS_DECISION_WIDGETS`` (the IPython extension
does it the first time a panel is shown; :func:`uninstall` undoes it).
:func:`decision_widget` returns the widget a panel shows, to drive it from code
(``decision_widget(panel).accept_button.click()``). Imports the core only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelext._core.reconcile import GIVE_UP

from ._panel import NEEDS_DECISION_WIDGETS, reset_decision_slots
from ._reconcile import ReconcileWidget, reconcile_for_handle
from ._revalidation import RevalidationWidget, revalidation_for_handle

if TYPE_CHECKING:
    from ._panel import ControlPanel

__all__ = [
    "decision_widget",
    "install",
    "installed",
    "reconciliation_for_panel",
    "revalidation_for_panel",
    "uninstall",
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


FACTORIES = (reconciliation_for_panel, revalidation_for_panel)


def install() -> None:
    """Show the decision widgets in every control panel (open ones included)."""
    added = False
    for factory in FACTORIES:
        if factory not in NEEDS_DECISION_WIDGETS:
            NEEDS_DECISION_WIDGETS.append(factory)
            added = True
    if added:
        reset_decision_slots()


def uninstall() -> None:
    """Undo :func:`install` (panels fall back to a one-line hint)."""
    removed = False
    for factory in FACTORIES:
        while factory in NEEDS_DECISION_WIDGETS:
            NEEDS_DECISION_WIDGETS.remove(factory)
            removed = True
    if removed:
        reset_decision_slots()


def installed() -> bool:
    return all(factory in NEEDS_DECISION_WIDGETS for factory in FACTORIES)


def decision_widget(panel: ControlPanel) -> ReconcileWidget | RevalidationWidget | None:
    """The decision widget the panel shows now (after a redraw), or None."""
    panel.refresh()
    for child in panel.decision_slot.children:
        if isinstance(child, (ReconcileWidget, RevalidationWidget)):
            return child
    return None
