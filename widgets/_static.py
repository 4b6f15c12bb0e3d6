"""The saved form of a panel: a static HTML output next to the live widget.

JupyterLab's widget renderer never falls back to an output's ``text/html``: with the
widget's model missing (a reopened notebook, a restarted kernel) it shows "Error
displaying widget: model not found" or hides itself. So a displayed panel also emits
its own ``text/html`` output, with a display id, updated to the panel's last state on
every status change. While the live widget is shown next to it, a style in the output
hides the copy; when the widget is gone or disconnected (kernel restarted), the copy is
what the notebook shows (and what nbconvert exports), stamped "as of" the time it was
read (in the reader's zone, named), with the command that brings the live panel back.
The overview of the runs (``kx.runs()``, ``_runs.py``) keeps a saved copy the same way
(``show_html`` / ``update_html``, its own live selector: ``hide_style``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Callable, Hashable

from kernelext._formatting import moment_text
from kernelext._shown import shown_html, shows

from ._render import PanelView, to_html

__all__ = ["SavedCopy", "hide_style"]

# While the live panel renders right after it, hide the copy; otherwise hide whatever
# the widget output shows instead ("Loading widget...", "model not found", or the old
# panel after a kernel restart, which ipywidgets marks jupyter-widgets-disconnected).
# (:has() cannot nest, so both rules test the live panel from the outside.)
LIVE = ".kernelext-panel.widget-box:not(.jupyter-widgets-disconnected)"


def hide_style(live: str, saved: str = ".kernelext-saved") -> str:
    """The ``<style>`` of a saved copy (class ``saved``) shown before a live widget
    (CSS selector ``live``): the copy hides while the widget renders, the widget output
    hides once it no longer can."""
    return (
        "<style>"
        f".jp-OutputArea-child:has({saved}):has(+ .jp-OutputArea-child {live})"
        "{display:none}"
        f".jp-OutputArea-child:has({saved}) + .jp-OutputArea-child:not(:has({live}))"
        "{display:none}"
        "</style>"
    )


STYLE = hide_style(LIVE)


def saved_html(view: PanelView) -> str:
    run = shown_html(repr(view.run_id))
    read = view.now or dt.datetime.now(dt.timezone.utc)  # the store's clock when read
    return (
        f'<div class="kernelext-saved">{STYLE}{to_html(view, static=False)}'
        '<div style="font-size:smaller">saved panel, '
        f'<span class="kernelext-as-of">as of {shown_html(moment_text(read))}</span>, '
        "not connected to a kernel; "
        f"for the live panel run <code>kx.panel({run})</code> "
        "(with <code>%load_ext kernelext</code> loaded)</div></div>"
    )


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class SavedCopy:
    """The static output of one panel: shown once, then updated when its status moves."""

    def __init__(self) -> None:
        self.display_id = f"kernelext-{uuid.uuid4().hex}"
        self.shown = False
        self._status: Hashable = None

    def show(self, view: PanelView) -> None:
        self.show_html(saved_html(view), view.status)

    def update(self, view: PanelView, *, force: bool = False) -> None:
        self.update_html(lambda: saved_html(view), view.status, force=force)

    def show_html(self, text: str, key: Hashable) -> None:
        """Display ``text`` as the copy (in a kernel only); ``key``: what it shows."""
        if not _in_kernel():
            return
        from IPython.display import display

        display({"text/html": text}, raw=True, display_id=self.display_id)  # type: ignore[no-untyped-call]
        self.shown = True
        self._status = key

    def update_html(self, text: Callable[[], str], key: Hashable, *, force: bool = False) -> None:
        """Replace the copy with ``text()`` when ``key`` moved (or ``force``)."""
        if not self.shown or (key == self._status and not force):
            return
        from IPython.display import update_display

        self._status = key
        with contextlib.suppress(Exception):
            bundle = {"text/html": text()}
            update_display(bundle, raw=True, display_id=self.display_id)  # type: ignore[no-untyped-call]

    @shows
    def __repr__(self) -> str:
        return f"SavedCopy({self.display_id})"
