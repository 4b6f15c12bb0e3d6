"""kernelext: stop and resume agents in notebooks safely.

Every external effect is recorded in a ledger, stop requests are honoured at safe
points, suspended runs expire, and everything is queryable with SQL.

The public API is what ``__all__`` lists (``tests/contracts/test_public_api.py`` pins it), plus the
public modules ``kernelext.errors`` (every error), ``kernelext.status`` (the run lifecycle),
``kernelext.langgraph`` and ``kernelext.widgets`` (the notebook widgets; it needs
ipywidgets, so ``import kernelext`` does not load it). Everything under an underscore
(``kernelext._core``, ``kernelext._store``, ...) is the engine and may change in any release.
"""

from . import errors, langgraph, openai_agents, pydantic_ai, status
from ._adapters.anthropic import wrap_anthropic as anthropic
from ._adapters.mcp import wrap_mcp as mcp
from ._adapters.openai import wrap_openai as openai
from ._adapters.tools import Tools as tools
from ._core.encoding.secrets import SECRETS as secrets
from ._core.ledger.effect import Effect, effect
from ._core.ledger.limits import limit
from ._core.lifecycle.agent import Agent, agent
from ._core.lifecycle.control import resume, stop
from ._core.lifecycle.expiry import on_expire, sweep
from ._core.lifecycle.handle import Handle
from ._core.lifecycle.reattach import panel
from ._core.lifecycle.restart import restart
from ._core.lifecycle.revalidation import Revalidation, revalidation
from ._core.lifecycle.run import Run
from ._core.people.approvals import approvals, approve, reject
from ._core.people.questions import answer, questions
from ._core.people.reconcile import reconcile
from ._core.plan.resume_plan import ResumePlan, plan
from ._core.process.api import configure, open_store, runs, sql
from ._core.process.current import checks, credentials
from ._core.views.timeline import timeline
from ._store.duckdb import duckdb_config
from .errors import (
    AgentCellStopped,
    AgentError,
    CheckWarning,
    ClaimConflict,
    CodeChangedError,
    CredentialError,
    EffectArgumentsMismatch,
    EffectFailed,
    EffectRejected,
    ForcedStop,
    ForeignStoreError,
    IntegrityError,
    InvalidName,
    ItemFailed,
    KernelextError,
    LedgerError,
    NameNotText,
    NeedsDecision,
    OwnershipLost,
    PlanChanged,
    QueryError,
    QueryTimeout,
    ReadOnlyError,
    RemoteItemError,
    ResultNotStorable,
    RunNotFound,
    RunStateError,
    SchemaTooNewError,
    SecretRefused,
    SerializationError,
    StateNotWritable,
    StopRequested,
    StoreError,
    StoreLockedError,
    StoreWriteError,
    SurfaceBreach,
    UnencodableArgument,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentCellStopped",
    "AgentError",
    "CheckWarning",
    "ClaimConflict",
    "CodeChangedError",
    "CredentialError",
    "Effect",
    "EffectArgumentsMismatch",
    "EffectFailed",
    "EffectRejected",
    "ForcedStop",
    "ForeignStoreError",
    "Handle",
    "IntegrityError",
    "InvalidName",
    "ItemFailed",
    "KernelextError",
    "LedgerError",
    "NameNotText",
    "NeedsDecision",
    "OwnershipLost",
    "PlanChanged",
    "QueryError",
    "QueryTimeout",
    "ReadOnlyError",
    "RemoteItemError",
    "ResultNotStorable",
    "ResumePlan",
    "Revalidation",
    "Run",
    "RunNotFound",
    "RunStateError",
    "SchemaTooNewError",
    "SecretRefused",
    "SerializationError",
    "StateNotWritable",
    "StopRequested",
    "StoreError",
    "StoreLockedError",
    "StoreWriteError",
    "SurfaceBreach",
    "UnencodableArgument",
    "__version__",
    "agent",
    "answer",
    "anthropic",
    "approvals",
    "approve",
    "checks",
    "configure",
    "credentials",
    "duckdb_config",
    "effect",
    "errors",
    "langgraph",
    "limit",
    "mcp",
    "on_expire",
    "open_store",
    "openai",
    "openai_agents",
    "panel",
    "plan",
    "pydantic_ai",
    "questions",
    "reconcile",
    "reject",
    "restart",
    "resume",
    "revalidation",
    "runs",
    "secrets",
    "sql",
    "status",
    "stop",
    "sweep",
    "timeline",
    "tools",
]


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext kernelext`` (IPython's extension hook; not part of ``__all__``)."""
    from ._ipython import extension

    extension.load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext kernelext`` (IPython's extension hook; not part of ``__all__``)."""
    from ._ipython import extension

    extension.unload(ipython)


def _show_errors_without_internals() -> None:
    """Inside IPython, kernelext errors show their message and the user's frames only."""
    from ._ipython.tracebacks import install_in_running_shell

    install_in_running_shell()


_show_errors_without_internals()
