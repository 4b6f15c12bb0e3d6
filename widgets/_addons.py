"""The one registry of what control panels show besides their own parts.

Every add-on is listed here with the slot it goes in: ``PANEL_ADDONS`` (under the status:
the live timeline, the resume plan, open approvals and questions, the expired-run banner)
and ``NEEDS_DECISION_WIDGETS`` (the reconciliation and revalidation widgets of a run in
``needs_decision``). :func:`install` puts every one in its slot, in this order, once;
:func:`uninstall` takes every one out. Importing ``kernelext.widgets`` installs them, and
so does the IPython extension when it loads the widgets; unloading it uninstalls them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._approvals import approvals_addon
from ._decisions import reconciliation_for_panel, revalidation_for_panel
from ._expired import expired_addon
from ._panel import NEEDS_DECISION_WIDGETS, PANEL_ADDONS, ControlPanel, reset_decision_slots
from ._plan import plan_addon
from ._timeline import timeline_addon

__all__ = ["ADDONS", "install", "installed", "uninstall"]

Slot = list[Callable[[ControlPanel], Any]]

# (slot, factory), in the order panels show them.
ADDONS: tuple[tuple[Slot, Callable[[ControlPanel], Any]], ...] = (
    (PANEL_ADDONS, timeline_addon),  # the stop estimate and a live timeline
    (PANEL_ADDONS, plan_addon),  # the resume plan of a waiting run, collapsed
    (PANEL_ADDONS, approvals_addon),  # an open approval or question, with its buttons
    (PANEL_ADDONS, expired_addon),  # an expired run's banner and its Restart button
    (NEEDS_DECISION_WIDGETS, reconciliation_for_panel),  # unknown effects to decide
    (NEEDS_DECISION_WIDGETS, revalidation_for_panel),  # changed facts to decide
)


def install() -> None:
    """Put every add-on in its slot (once; open panels show the decision widgets too)."""
    decisions = False
    for slot, factory in ADDONS:
        if factory not in slot:
            slot.append(factory)
            decisions = decisions or slot is NEEDS_DECISION_WIDGETS
    if decisions:
        reset_decision_slots()


def uninstall() -> None:
    """Take every add-on out of its slot (panels fall back to a one-line hint)."""
    decisions = False
    for slot, factory in ADDONS:
        while factory in slot:
            slot.remove(factory)
            decisions = decisions or slot is NEEDS_DECISION_WIDGETS
    if decisions:
        reset_decision_slots()


def installed() -> bool:
    """Whether every add-on is in its slot."""
    return all(factory in slot for slot, factory in ADDONS)
