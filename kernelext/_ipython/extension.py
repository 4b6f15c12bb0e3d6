"""``%load_ext kernelext`` / ``%unload_ext kernelext``.

Loading registers the :class:`~.magics.Kernelext` magics and options, makes a run
handle display as its control panel, ``kx.reconcile(run_id)`` as the reconciliation
widget, ``kx.revalidation(run_id)`` as the revalidation widget and ``kx.runs()`` as the
live overview of the runs, and installs the soft interrupt. The store is opened lazily,
on first use. Nothing here imports ipywidgets: the widget modules are imported the first
time something is displayed, which keeps loading fast. Once the panel module is in use,
every panel add-on of the one registry (``kernelext.widgets._addons``: timeline, plan,
approvals, expired-run banner, decision widgets) is installed; unloading uninstalls them
all.

Loading also starts the kernel's sweeper: a daemon thread that runs ``kx.sweep()``
every ``SWEEP_INTERVAL_S`` seconds (60) once the store is open (it never opens the store
itself), so suspended runs expire and ``kx.on_expire`` callbacks are called while the
notebook sits idle. ``%unload_ext kernelext`` stops it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from .._core.lifecycle.expiry import Sweeper, SweepResult
from .._core.process.runtime import Settings, runtime
from . import options
from .interrupt import InterruptHandler, kernel_supports_soft_interrupt, live_handles
from .magics import Kernelext, forget_notebook_options
from .tracebacks import install as install_tracebacks

__all__ = [
    "load",
    "loaded",
    "reconciliation_bundle",
    "render_handle",
    "revalidation_bundle",
    "runs_bundle",
    "sweeper",
    "unload",
]

PANEL_MODULE = "kernelext.widgets._panel"
RUNS_MODULE = "kernelext.widgets._runs"
ADDONS_MODULE = "kernelext.widgets._addons"
SWEEP_INTERVAL_S = 60.0  # the kernel's sweeper; read when the extension is loaded


class KernelSweeper(Sweeper):
    """The kernel's periodic sweeper: sweeps the default store once it is open (loading
    the extension never creates a store), first one interval after loading."""

    def sweep_once(self) -> SweepResult | None:
        if not runtime().settings.store_open:
            return None
        return super().sweep_once()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sweep_once()


class _Loaded:
    def __init__(
        self,
        shell: Any,
        magics: Kernelext,
        settings: Settings,
        store_was_open: bool,
        previous_options: dict[str, Any],
    ) -> None:
        self.shell = shell
        self.magics = magics
        self.settings = settings  # of the runtime that was current at loading
        # The renderer in each slot before loading, put back together on unloading.
        self.previous_renderers = {slot: getattr(settings, slot) for slot in RENDERERS}
        self.store_was_open = store_was_open
        self.previous_options = previous_options  # the notebook options before loading
        self.sweeper: Sweeper | None = None


_STATE: _Loaded | None = None


def loaded() -> Kernelext | None:
    """The magics instance of the loaded extension (None when not loaded)."""
    return _STATE.magics if _STATE is not None else None


def render_handle(handle: Any) -> dict[str, Any]:
    """Display a run handle as its control panel (plus static HTML and plain text)."""
    try:
        _install_addons(force=True)
        from kernelext.widgets._panel import panel_mimebundle

        return panel_mimebundle(handle)
    except Exception as exc:  # a panel failure must not hide the run
        return {"text/plain": f"{handle.text_summary()}\n(panel unavailable: {exc})"}


def reconciliation_bundle(rec: Any) -> dict[str, Any]:
    """Display ``kx.reconcile(run_id)`` as the reconciliation widget (plus its text)."""
    try:
        from kernelext.widgets._reconcile import reconciliation_mimebundle

        return reconciliation_mimebundle(rec)
    except Exception as exc:  # a widget failure must not hide the unknowns
        return {"text/plain": f"{rec.text()}\n(widget unavailable: {exc})"}


def revalidation_bundle(rev: Any) -> dict[str, Any]:
    """Display ``kx.revalidation(run_id)`` as the revalidation widget (plus its text)."""
    try:
        from kernelext.widgets._revalidation import revalidation_mimebundle

        return revalidation_mimebundle(rev)
    except Exception as exc:  # a widget failure must not hide the facts
        return {"text/plain": f"{rev.text()}\n(widget unavailable: {exc})"}


def approvals_bundle(items: Any) -> dict[str, Any]:
    """Display ``kx.approvals()`` / ``kx.questions()`` as cards with their buttons."""
    try:
        from kernelext.widgets._approvals import approvals_mimebundle

        return approvals_mimebundle(items)
    except Exception as exc:  # a widget failure must not hide the requests
        return {"text/plain": f"{items.text()}\n(widget unavailable: {exc})"}


def runs_bundle(frame: Any) -> dict[str, Any]:
    """Display ``kx.runs()`` as the live overview of the runs (plus its table as text)."""
    try:
        from kernelext.widgets._runs import runs_mimebundle

        return runs_mimebundle(frame)
    except Exception as exc:  # a widget failure must not hide the table
        import pandas as pd

        text = pd.DataFrame.__repr__(frame)
        return {
            "text/plain": f"{text}\n(live overview unavailable: {exc})",
            "text/html": pd.DataFrame._repr_html_(frame),
        }


# The renderer slots of ``Settings`` the extension fills, and what it puts in each.
RENDERERS: dict[str, Any] = {
    "handle_renderer": render_handle,
    "reconcile_renderer": reconciliation_bundle,
    "revalidation_renderer": revalidation_bundle,
    "approvals_renderer": approvals_bundle,
    "runs_renderer": runs_bundle,
}


def _install_addons(force: bool = False) -> None:
    """Panels show every add-on of the widgets' registry (``kernelext.widgets._addons``).

    Done once the panel module is in use (``force`` imports it), so that loading the
    extension does not import ipywidgets.
    """
    if _STATE is None or not (force or PANEL_MODULE in sys.modules):
        return
    from kernelext.widgets._addons import install

    install()


def _refresh_panels(*_: Any) -> None:
    """After each cell: push the panels' latest state while the kernel still answers the
    cell (nbclient records widget state only from messages of the cell it runs)."""
    module = sys.modules.get(PANEL_MODULE)
    if module is not None:
        _install_addons()
        module.refresh_open_panels()


def load(shell: Any) -> None:
    global _STATE
    if _STATE is not None:
        if _STATE.shell is shell:
            return
        unload(_STATE.shell)
    settings = runtime().settings
    store_was_open = settings.store_open
    previous_options = options.saved()
    magics = Kernelext(shell=shell)
    shell.register_magics(magics)
    install_tracebacks(shell)
    kernel = getattr(shell, "kernel", None)
    if kernel is not None and kernel_supports_soft_interrupt(kernel):
        # Installed whatever soft_interrupt says: a press reads it (kx.configure may change it).
        magics.interrupt = InterruptHandler(kernel)
        magics.interrupt.install()
    _STATE = _Loaded(shell, magics, settings, store_was_open, previous_options)
    for slot, renderer in RENDERERS.items():
        setattr(settings, slot, renderer)
    shell.events.register("post_execute", _refresh_panels)
    _install_addons()
    _STATE.sweeper = KernelSweeper(SWEEP_INTERVAL_S).start()


def sweeper() -> Sweeper | None:
    """The kernel's periodic sweeper while the extension is loaded."""
    return _STATE.sweeper if _STATE is not None else None


def unload(shell: Any) -> None:
    """Undo :func:`load`: magics, options, panel rendering, interrupt handling."""
    global _STATE
    state = _STATE
    if state is None or state.shell is not shell:
        return
    _STATE = None
    if state.sweeper is not None:
        state.sweeper.stop()
    magics = state.magics
    manager = shell.magics_manager
    for kind, table in magics.magics.items():
        for name in table:
            if manager.magics.get(kind, {}).get(name) == table[name]:
                del manager.magics[kind][name]
    if manager.registry.get(type(magics).__name__) is magics:
        del manager.registry[type(magics).__name__]
    if magics in shell.configurables:
        shell.configurables.remove(magics)
    if magics.interrupt is not None:
        magics.interrupt.uninstall()
    settings = state.settings
    options.restore(state.previous_options, settings)
    forget_notebook_options()  # put back: the next load applies their %config values again
    for slot, renderer in RENDERERS.items():
        if getattr(settings, slot) is renderer:  # not replaced since loading
            setattr(settings, slot, state.previous_renderers[slot])
    addons = sys.modules.get(ADDONS_MODULE)
    if addons is not None:
        addons.uninstall()
    with contextlib.suppress(ValueError):
        shell.events.unregister("post_execute", _refresh_panels)
    module = sys.modules.get(PANEL_MODULE)
    if module is not None:
        module.close_open_panels()
    overviews = sys.modules.get(RUNS_MODULE)
    if overviews is not None:
        overviews.close_open_overviews()
    if not state.store_was_open and not live_handles():
        settings.close()  # opened lazily by this session; the next use opens it again
