"""The notebook options, as the IPython layer reads them when it acts.

``%config Kernelext.<name> = value`` and ``kx.configure(<name>=value)`` set the same
setting of the current runtime (both go through ``kx.configure``, so both check values the same
way). The options below matter only in a notebook; they are read when a cell runs
(``max_step_seconds``, ``allow_files``) or the interrupt button is pressed
(``soft_interrupt``, ``interrupt_window``), so a change takes hold at once.
"""

from __future__ import annotations

from typing import Any

from .._core.runtime import Settings, runtime

__all__ = ["NOTEBOOK_OPTIONS", "notebook_option", "restore", "saved"]

# name -> its value until it is configured
NOTEBOOK_OPTIONS: dict[str, Any] = {
    "max_step_seconds": None,  # default time bound of one %%agent cell
    "soft_interrupt": True,  # the interrupt button asks a live agent to stop
    "interrupt_window": 2.0,  # a second press within it forces the stop
    "allow_files": False,  # %%ledger may read files outside the store
}


def notebook_option(name: str) -> Any:
    """The current value of notebook option ``name``."""
    return getattr(runtime().settings, name, NOTEBOOK_OPTIONS[name])


def saved() -> dict[str, Any]:
    """The notebook options now (the extension restores them when it is unloaded)."""
    return {name: notebook_option(name) for name in NOTEBOOK_OPTIONS}


def restore(values: dict[str, Any], settings: Settings | None = None) -> None:
    """Put back what :func:`saved` returned (into ``settings``, default the current ones)."""
    settings = settings if settings is not None else runtime().settings
    for name, value in values.items():
        setattr(settings, name, value)
