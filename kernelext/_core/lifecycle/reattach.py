"""``kx.panel(run_id)``: a live panel for a run that already exists (after a kernel
restart, in another notebook, or for a run another process executes)."""

from __future__ import annotations

from ..._store import Store
from ..._validate import RUN_ID, STORE, validated
from .control import handle_for
from .handle import Handle

__all__ = ["panel"]


@validated("kx.panel", run_id=RUN_ID, store=STORE)
def panel(run_id: str, *, store: Store | None = None) -> Handle:
    """The handle of run ``run_id``; shown as the last expression of a cell it displays
    the run's live control panel (status, effects, Stop / Resume).

    Reattaches a panel after a kernel restart: the run keeps its status in the store, and
    this panel follows it from now on (in a fresh kernel, run ``%load_ext kernelext``
    first: without it a handle shows as one line of text). An unknown ``run_id`` raises
    :class:`kx.RunNotFound` with the closest run ids.
    """
    return handle_for(run_id, store=store)
