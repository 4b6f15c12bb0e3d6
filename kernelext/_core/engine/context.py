"""Which run the current thread is executing: its engine (``RunEngine``), for ``@effect``,
the adapters and the helpers they call."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run_engine import RunEngine

__all__ = ["current_run", "reset_current_run", "set_current_run"]

_CURRENT: contextvars.ContextVar[RunEngine | None] = contextvars.ContextVar(
    "kernelext_run", default=None
)


def current_run() -> RunEngine | None:
    return _CURRENT.get()


def set_current_run(run: RunEngine | None) -> contextvars.Token[RunEngine | None]:
    return _CURRENT.set(run)


def reset_current_run(token: contextvars.Token[RunEngine | None]) -> None:
    _CURRENT.reset(token)
