"""ipywidgets panels for kernelext (installed as ``kernelext.widgets``).

``panel_for(handle)`` gives a run's control panel; a handle displayed in a notebook
with ``%load_ext kernelext`` shows it. Imports the core only, never the store.
"""

from __future__ import annotations

from ._approvals import install as _install_approvals
from ._panel import (
    NEEDS_DECISION_WIDGETS,
    PANEL_ADDONS,
    ControlPanel,
    panel_for,
    panel_mimebundle,
)
from ._plan import install as _install_plan
from ._timeline import LiveTimeline
from ._timeline import install as _install_timeline

# Every control panel shows: the stop estimate and a live timeline; the resume plan of a
# waiting run above Resume; an open approval or question with its buttons.
_install_timeline()
_install_plan()
_install_approvals()

__all__ = [
    "NEEDS_DECISION_WIDGETS",
    "PANEL_ADDONS",
    "ControlPanel",
    "LiveTimeline",
    "panel_for",
    "panel_mimebundle",
]
