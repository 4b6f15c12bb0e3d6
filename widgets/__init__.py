"""ipywidgets panels for kernelext (installed as ``kernelext.widgets``).

``panel_for(handle)`` gives a run's control panel; a handle displayed in a notebook
with ``%load_ext kernelext`` shows it. ``panel.view`` (and ``panel.refresh()``) is the
:class:`PanelView` it shows (``panel.view.stop_text()``, ``panel.view.status``);
``decision_widget(panel)`` is the reconciliation or revalidation widget a waiting run's
panel holds. :class:`ExpiredBanner` is an expired run's banner with Restart; every control
panel of an expired run carries it.
Imports the core only, never the store.
"""

from __future__ import annotations

from . import _addons
from ._decisions import decision_widget
from ._expired import ExpiredBanner
from ._panel import (
    NEEDS_DECISION_WIDGETS,
    PANEL_ADDONS,
    ControlPanel,
    panel_for,
    panel_mimebundle,
)
from ._render import PanelView
from ._timeline import LiveTimeline

# Every control panel shows the add-ons of the one registry (``_addons``): the stop
# estimate and a live timeline; the resume plan of a waiting run (collapsed); an open
# approval or question with its buttons; an expired run's banner; the decision widgets.
_addons.install()

__all__ = [
    "NEEDS_DECISION_WIDGETS",
    "PANEL_ADDONS",
    "ControlPanel",
    "ExpiredBanner",
    "LiveTimeline",
    "PanelView",
    "decision_widget",
    "panel_for",
    "panel_mimebundle",
]
