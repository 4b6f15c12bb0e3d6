"""kernelext: stop and resume agents in notebooks safely.

Every external effect is recorded in a ledger, stop requests are honoured at safe
points, suspended runs expire, and everything is queryable with SQL.
"""

from __future__ import annotations

import importlib
from typing import Any

from .core.api import configure, open_store, runs, sql, stop
from .core.checks import CHECKS as checks
from .core.checks import CheckWarning
from .core.credentials import CREDENTIALS as credentials
from .core.credentials import CredentialError
from .core.engine import Agent, Handle, agent
from .core.expiry import on_expire, sweep
from .core.ledger import Effect, EffectFailed, effect
from .core.reconcile import reconcile
from .core.restart import restart
from .core.resume import resume
from .core.revalidation import Revalidation, revalidation
from .core.run import Run
from .core.secrets import SECRETS as secrets
from .errors import (
    ClaimConflict,
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
    "CheckWarning",
    "ClaimConflict",
    "CodeChangedError",
    "CredentialError",
    "Effect",
    "EffectArgumentsMismatch",
    "EffectFailed",
    "ForcedStop",
    "Handle",
    "KernelextError",
    "LedgerError",
    "NeedsDecision",
    "Revalidation",
    "Run",
    "RunNotFound",
    "RunStateError",
    "SerializationError",
    "StopRequested",
    "StoreLockedError",
    "__version__",
    "agent",
    "checks",
    "configure",
    "credentials",
    "effect",
    "on_expire",
    "open_store",
    "reconcile",
    "restart",
    "resume",
    "revalidation",
    "runs",
    "secrets",
    "sql",
    "stop",
    "sweep",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext kernelext``."""
    importlib.import_module("kernelext.ipython.extension").load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    importlib.import_module("kernelext.ipython.extension").unload(ipython)
