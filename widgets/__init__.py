"""ipywidgets panels for kernelext (installed as ``kernelext.widgets``).

``panel_for(handle)`` gives a run's control panel; a handle displayed in a notebook
with ``%load_ext kernelext`` shows it. ``panel.view`` (and ``panel.refresh()``) is the
:class:`PanelView` it shows (``panel.view.stop_text()``, ``panel.view.status``);
``decision_widget(panel)`` is the reconciliation or revalidation widget a waiting run's
panel holds. :class:`ExpiredBanner` is an expired run's banner with Restart: importing it
(``from kernelext.widgets import ExpiredBanner``) also puts it on every control panel.
Imports the core only, never the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._approvals import install as _install_approvals
from ._decisions import decision_widget
from ._panel import (
    NEEDS_DECISION_WIDGETS,
    PANEL_ADDONS,
    ControlPanel,
    panel_for,
    panel_mimebundle,
)
from ._plan import install as _install_plan
from ._render import PanelView
from ._timeline import LiveTimeline
from ._timeline import install as _install_timeline

if TYPE_CHECKING:  # at run time from __getattr__: its first import installs the banner
    from ._expired import ExpiredBanner

# Every control panel shows: the stop estimate and a live timeline; the resume plan of a
# waiting run above Resume; an open approval or question with its buttons.
_install_timeline()
_install_plan()
_install_approvals()

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


def __getattr__(name: str) -> Any:
    if name == "ExpiredBanner":
        from ._expired import ExpiredBanner

        return ExpiredBanner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
