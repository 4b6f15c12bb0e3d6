"""The notebook options, as the IPython layer reads them when it acts.

``%config Kernelext.<name> = value`` and ``kx.configure(<name>=value)`` set the same
setting of the current runtime (both go through ``kx.configure``, so both check values the same
way). The notebook options (declared with ``notebook=True`` in
``kernelext/_core/process/options.py``)
matter only in a notebook; they are read when a cell runs
(``max_step_seconds``, ``allow_files``) or the interrupt button is pressed
(``soft_interrupt``, ``interrupt_window``), so a change takes hold at once.
"""

from __future__ import annotations

from typing import Any

from .._core.process.options import OPTIONS
from .._core.process.runtime import Settings, runtime

__all__ = ["NOTEBOOK_OPTIONS", "notebook_option", "restore", "saved"]

# the options read only in a notebook (declared, with their defaults, in _core/process/options.py)
NOTEBOOK_OPTIONS: tuple[str, ...] = tuple(option.name for option in OPTIONS if option.notebook)


def notebook_option(name: str) -> Any:
    """The current value of notebook option ``name``."""
    if name not in NOTEBOOK_OPTIONS:
        raise KeyError(name)
    return getattr(runtime().settings, name)


def saved() -> dict[str, Any]:
    """The notebook options now (the extension restores them when it is unloaded)."""
    return {name: notebook_option(name) for name in NOTEBOOK_OPTIONS}


def restore(values: dict[str, Any], settings: Settings | None = None) -> None:
    """Put back what :func:`saved` returned (into ``settings``, default the current ones)."""
    settings = settings if settings is not None else runtime().settings
    for name, value in values.items():
        setattr(settings, name, value)
