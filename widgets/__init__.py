"""ipywidgets panels for kernelext (installed as ``kernelext.widgets``).

``panel_for(handle)`` gives a run's control panel; a handle displayed in a notebook
with ``%load_ext kernelext`` shows it. Imports the core only, never the store.
"""

from __future__ import annotations

from .panel import (
    NEEDS_DECISION_WIDGETS,
    PANEL_ADDONS,
    ControlPanel,
    panel_for,
    panel_mimebundle,
)

__all__ = [
    "NEEDS_DECISION_WIDGETS",
    "PANEL_ADDONS",
    "ControlPanel",
    "panel_for",
    "panel_mimebundle",
]
