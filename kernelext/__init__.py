"""kernelext: stop and resume agents in notebooks safely.

Every external effect is recorded in a ledger, stop requests are honoured at safe
points, suspended runs expire, and everything is queryable with SQL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._adapters.mcp import wrap_mcp as mcp
from ._adapters.openai import wrap_openai as openai
from ._adapters.tools import Tools as tools
from ._core.agent import Agent, agent
from ._core.api import configure, open_store, runs, sql
from ._core.approvals import approvals
from ._core.checks import CheckWarning
from ._core.control import resume, stop
from ._core.credentials import CredentialError
from ._core.expiry import on_expire, sweep
from ._core.handle import Handle
from ._core.ledger import Effect, EffectFailed, effect
from ._core.plan import PlanChanged, ResumePlan, plan
from ._core.questions import answer, questions
from ._core.reconcile import reconcile
from ._core.restart import restart
from ._core.revalidation import Revalidation, revalidation
from ._core.run import Run
from ._core.runtime import runtime as _runtime
from ._core.secrets import SECRETS as secrets
from ._core.timeline import timeline
from .errors import (
    ClaimConflict,
    CodeChangedError,
    EffectArgumentsMismatch,
    EffectRejected,
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

if TYPE_CHECKING:  # at run time: __getattr__, the registries of the current runtime
    from ._core.registries import CheckRegistry, CredentialRegistry

    checks: CheckRegistry
    credentials: CredentialRegistry

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
    "EffectRejected",
    "ForcedStop",
    "Handle",
    "KernelextError",
    "LedgerError",
    "NeedsDecision",
    "PlanChanged",
    "ResumePlan",
    "Revalidation",
    "Run",
    "RunNotFound",
    "RunStateError",
    "SerializationError",
    "StopRequested",
    "StoreLockedError",
    "__version__",
    "agent",
    "answer",
    "approvals",
    "checks",
    "configure",
    "credentials",
    "effect",
    "mcp",
    "on_expire",
    "open_store",
    "openai",
    "plan",
    "questions",
    "reconcile",
    "restart",
    "resume",
    "revalidation",
    "runs",
    "secrets",
    "sql",
    "stop",
    "sweep",
    "timeline",
    "tools",
]


# Loaded on first use: ``kx.langgraph`` (the module itself imports LangGraph lazily too).
_LAZY = {"langgraph": "kernelext._adapters.langgraph"}


def __getattr__(name: str) -> Any:
    if name == "checks":  # read at each use: a new runtime has registries of its own
        return _runtime().checks
    if name == "credentials":
        return _runtime().credentials
    if name in _LAZY:
        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'kernelext' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext kernelext``."""
    importlib.import_module("kernelext._ipython.extension").load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    importlib.import_module("kernelext._ipython.extension").unload(ipython)
