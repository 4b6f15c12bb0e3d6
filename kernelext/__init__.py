"""kernelext: stop and resume agents in notebooks safely.

Every external effect is recorded in a ledger, stop requests are honoured at safe
points, suspended runs expire, and everything is queryable with SQL.
"""

from __future__ import annotations

import importlib
from typing import Any

from .core.api import configure, open_store, runs, sql, stop
from .core.engine import Agent, Handle, agent
from .core.ledger import Effect, EffectFailed, effect
from .core.reconcile import reconcile
from .core.resume import resume
from .core.run import Run
from .errors import (
    CodeChangedError,
    EffectArgumentsMismatch,
    ForcedStop,
    KernelextError,
    LedgerError,
    NeedsDecision,
    RunNotFound,
    RunStateError,
    SerializationError,
    StopRequested,
    StoreLockedError,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "CodeChangedError",
    "Effect",
    "EffectArgumentsMismatch",
    "EffectFailed",
    "ForcedStop",
    "Handle",
    "KernelextError",
    "LedgerError",
    "NeedsDecision",
    "Run",
    "RunNotFound",
    "RunStateError",
    "SerializationError",
    "StopRequested",
    "StoreLockedError",
    "__version__",
    "agent",
    "configure",
    "effect",
    "open_store",
    "reconcile",
    "resume",
    "runs",
    "sql",
    "stop",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext kernelext``."""
    importlib.import_module("kernelext.ipython.extension").load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    importlib.import_module("kernelext.ipython.extension").unload(ipython)
