"""Every error kernelext raises, in one hierarchy. Every message says what happened and
what to do. Each name is reachable as ``kernelext.errors.<Name>`` and as ``kx.<Name>``.

::

    BaseException
    └── StopRequested                 a stop landed at a safe point (not an ``Exception``,
        └── ForcedStop                so ``except Exception`` cannot swallow it)
    Exception
    └── KernelextError                every error kernelext raises on purpose
        ├── StoreError                the store cannot be opened, read or written
        │   ├── StoreLockedError      another process holds the store file
        │   ├── StoreWriteError       a record could not be made durable
        │   ├── IntegrityError        a stored payload does not match its hash
        │   ├── SchemaTooNewError     written by a newer kernelext
        │   ├── ForeignStoreError     a DuckDB file kernelext did not create
        │   ├── ReadOnlyError         (also ValueError) a write sent to a read-only entry point
        │   └── SurfaceBreach         a checked query did something behind the check
        ├── QueryError                (also ValueError) the database refused a ``kx.sql`` query
        ├── QueryTimeout              (also TimeoutError) a ``kx.sql`` query ran past its timeout
        ├── RunNotFound               (also LookupError) no run with that id
        ├── RunStateError             the run's state does not allow the request
        │   ├── OwnershipLost         another process took the run over
        │   ├── CodeChangedError      the agent's code changed since the run started
        │   ├── ClaimConflict         a resource is claimed by another run
        │   └── PlanChanged           the run changed since its plan was previewed
        ├── AgentError                the agent is not defined or not usable here
        ├── AgentCellStopped          a ``%%agent`` cell that did not (fully) run
        ├── CredentialError           a credential could not be refreshed
        ├── SecretRefused             (also ValueError) an exact value holds a secret
        ├── InvalidName               (also ValueError) a run id, step key or tool name
        │   └── NameNotText           (also TypeError) ... that is not a ``str``
        ├── SerializationError        (also TypeError) a value cannot be stored safely
        │   ├── UnencodableArgument   an effect's argument has no faithful encoding
        │   └── ResultNotStorable     (also NeedsDecision) an applied effect's result cannot be
        │                             stored: it is unknown until reconciled
        ├── ItemFailed                a ``run.map`` item raised (its exception is the cause)
        ├── RemoteItemError           an item's exception from another process that could
        │                             not travel back as itself (its type and text)
        ├── StateNotWritable          (also TypeError) ``run.state`` written inside an item
        ├── LedgerError               the effect ledger refuses a call
        │   ├── EffectArgumentsMismatch   an effect key reused with other arguments
        │   ├── EffectRejected        a person rejected the call
        │   └── EffectFailed          the effect failed before; not retried silently
        └── NeedsDecision             the run waits for a human decision
            └── ResultNotStorable
    Warning
    └── UserWarning
        └── CheckWarning              a check only a resume in this process can call again

``did_you_mean`` builds the "Did you mean ...?" hint the messages end with.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ._did_you_mean import did_you_mean
from ._formatting import moment_text as _moment_text
from ._shown import shows as _shows

__all__ = [
    "AgentCellStopped",
    "AgentError",
    "CheckWarning",
    "ClaimConflict",
    "CodeChangedError",
    "CredentialError",
    "EffectArgumentsMismatch",
    "EffectFailed",
    "EffectRejected",
    "ForcedStop",
    "ForeignStoreError",
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
    "did_you_mean",
]


class KernelextError(Exception):
    """Base class of every error kernelext raises on purpose."""

    @_shows  # its text names runs, steps and tools as stored: through the display door
    def __str__(self) -> str:
        return super().__str__()


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], keywords: dict[str, Any]) -> Any:
    """Unpickle an error whose constructor takes keyword-only arguments."""
    return cls(*args, **keywords)


class StoreError(KernelextError):
    """The store cannot be opened, read or written."""


class StoreLockedError(StoreError):
    """Another process holds the store file."""

    def __init__(self, path: str, pid: int | None, detail: str = "") -> None:
        self.path = path
        self.pid = pid
        self.detail = detail
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"The kernelext store {path!r} is held by {holder}. DuckDB allows one process "
            "per file. Stop that process (or its notebook kernel), or point this process at "
            "its own store with KERNELEXT_STORE=/path/to/other.duckdb "
            "(in a notebook: %config Kernelext.store = '...')." + (f" [{detail}]" if detail else "")
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickle: the constructor's own arguments
        return (type(self), (self.path, self.pid, self.detail), self.__dict__)


class StoreWriteError(StoreError):
    """A record could not be made durable (disk full, out of memory, read-only folder).

    Nothing was acknowledged: the call that raised it did not happen as far as the
    store is concerned, and what was acknowledged before is kept.
    """


class IntegrityError(StoreError):
    """A stored payload does not match the hash recorded for it."""


class SchemaTooNewError(StoreError):
    """The store was written by a newer kernelext; this release will not write to it."""


class ForeignStoreError(StoreError):
    """The file is a DuckDB database that kernelext did not create."""


class ReadOnlyError(StoreError, ValueError):
    """A statement that writes was sent to a read-only entry point."""


class SurfaceBreach(StoreError):
    """A query that passed the SQL check did something behind it (the third layer saw it)."""


class QueryError(KernelextError, ValueError):
    """The database refused a query of the read-only SQL surface (``kx.sql``, ``%%ledger``,
    ``kernelext sql``): a table or column it does not know, SQL it cannot parse, a value it
    cannot convert. The message is the database's, with what to do; the database's own
    exception is ``__cause__``."""


class QueryTimeout(KernelextError, TimeoutError):
    """A query of the read-only SQL surface ran longer than its ``timeout`` and was
    interrupted; nothing it read is returned."""


class RunNotFound(KernelextError, LookupError):
    """No run with that id is in the store."""


class RunStateError(KernelextError):
    """The run is in a state that does not allow the request."""


class OwnershipLost(RunStateError):
    """Another process took this run over: this process's writes for it are refused.

    ``owner``: who owns the run now, ``since``: when it took it over (UTC), ``epoch``: the
    run's ownership epoch now, ``held``: the epoch this process held."""

    def __init__(
        self,
        run_id: str,
        *,
        owner: str | None,
        since: object = None,
        epoch: int | None = None,
        held: int | None = None,
        what: str = "write",
    ) -> None:
        self.run_id = run_id
        self.owner = owner
        self.since = since
        self.epoch = epoch
        self.held = held
        self.what = what
        when = f" since {_moment_text(since)}" if isinstance(since, dt.datetime) else ""
        mine = f", this process held epoch {held}" if held is not None else ""
        if what == "effect intent":
            sent = "was refused and nothing was sent for it"
        elif what == "effect outcome":
            sent = (
                "was refused: the call was made, and it is in the ledger as unknown for the "
                "owner to settle (kx.reconcile)"
            )
        else:
            sent = (
                "was refused. An effect whose intent this process recorded before the "
                "take-over may have been called: it is in the ledger as unknown (kx.reconcile), "
                "never called again blindly"
            )
        super().__init__(
            f"Run {run_id!r} is owned by {owner or 'another process'}{when} (ownership epoch "
            f"{epoch}{mine}); this process's {what} {sent}. What this process knows of the "
            "run is stale. To take the run back, stop it there "
            f"(kx.stop({run_id!r})), then `%agent resume {run_id}` or kx.resume({run_id!r})."
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickle: keyword-only arguments, rebuilt
        keywords = {"owner": self.owner, "since": self.since, "epoch": self.epoch}
        keywords |= {"held": self.held, "what": self.what}
        return (_rebuild, (type(self), (self.run_id,), keywords), self.__dict__)


class CodeChangedError(RunStateError):
    """The agent's code differs from the code that started the run."""


class ClaimConflict(RunStateError):
    """A resource is already claimed by another live or suspended run."""


class PlanChanged(RunStateError):
    """The run changed since its plan was previewed; the resume did not happen.

    ``differences``: what changed, one line each; ``plan``: the run's plan now (a
    ``kx.ResumePlan``)."""

    def __init__(self, message: str, differences: list[str], current: Any) -> None:
        super().__init__(message)
        self.differences = differences
        self.plan = current

    def __reduce__(self) -> tuple[Any, ...]:  # pickle: the constructor's own arguments
        return (type(self), (str(self), self.differences, self.plan), self.__dict__)


class AgentError(KernelextError):
    """The agent is not defined or not usable in this process."""


class AgentCellStopped(KernelextError):
    """A ``%%agent`` cell that did not (fully) run. Displays as one line, no traceback.

    ``run_id``: the cell's run, ``status``: the run's status when the cell stopped."""

    def __init__(self, message: str, *, run_id: str, status: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:  # pickle: keyword-only arguments, rebuilt
        keywords = {"run_id": self.run_id, "status": self.status}
        return (_rebuild, (type(self), (str(self),), keywords), self.__dict__)

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"\x1b[1;31m■ kernelext:\x1b[0m {self}"]


class CredentialError(KernelextError):
    """A credential could not be refreshed (the resume stopped) or is not available."""


class SecretRefused(KernelextError, ValueError):
    """A value that must be stored exactly (an id, a snapshot) holds a registered secret."""


class SerializationError(KernelextError, TypeError):
    """A value cannot be stored safely."""


class UnencodableArgument(SerializationError):
    """An effect's argument has no faithful encoding, so the call cannot be bound to it
    (for its approval and for ``EffectArgumentsMismatch``); nothing was recorded."""


class InvalidName(KernelextError, ValueError):
    """A run id, step key or tool name kernelext cannot store faithfully (not text, empty,
    too long, a NUL character or a lone surrogate); refused before anything is recorded."""


class NameNotText(InvalidName, TypeError):
    """A run id, step key or tool name that is not a ``str`` at all."""


class ItemFailed(KernelextError):
    """A ``run.map`` item raised: no new item started, the items in flight finished, and
    the run ends ``failed``; a resume after the fix runs only the items not completed.
    ``key`` is the item's step key; the item's exception is ``__cause__``."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:  # pickle: keyword-only arguments, rebuilt
        return (_rebuild, (type(self), (str(self),), {"key": self.key}), self.__dict__)


class RemoteItemError(KernelextError):
    """A ``run.map(..., executor=...)`` item in another process raised an exception that
    could not travel back as itself (its class cannot be pickled or imported here), or
    the executor lost the item (its worker died too often): the text names the original
    type and message, and a note holds the worker's traceback (scrubbed)."""


class StateNotWritable(KernelextError, TypeError):
    """``run.state`` was written from inside a ``run.map`` item: return the value from the
    item instead (``run.map`` returns them in input order)."""


class LedgerError(KernelextError):
    """The effect ledger refuses a call."""


class EffectArgumentsMismatch(LedgerError):
    """An effect key was reused with different arguments."""


class EffectRejected(LedgerError):
    """A person rejected this call of an effect that needs approval; it was not made.

    Raised in the agent at the call (and again at that call on every replay), so the
    agent can take another path. ``key`` is the effect's key, ``note`` the reason given.
    """

    def __init__(
        self, message: str, *, key: str = "", tool: str = "", note: str | None = None
    ) -> None:
        super().__init__(message)
        self.key = key
        self.tool = tool
        self.note = note

    def __reduce__(self) -> tuple[Any, ...]:  # pickle: keyword-only arguments, rebuilt
        keywords = {"key": self.key, "tool": self.tool, "note": self.note}
        return (_rebuild, (type(self), (str(self),), keywords), self.__dict__)


class EffectFailed(LedgerError):
    """An effect failed before; by default it is not retried silently on resume."""


class NeedsDecision(KernelextError):
    """The run waits for a human decision (an unknown effect or a stale fact)."""


class ResultNotStorable(NeedsDecision, SerializationError):
    """An effect was applied but its result cannot be stored; the effect is ``unknown``
    until ``kx.reconcile`` decides it (``mark_applied(result=...)`` with a storable value)."""


class StopRequested(BaseException):
    """Raised at a safe point inside an agent when a stop was requested.

    It derives from BaseException so that ``except Exception`` in user code cannot
    swallow it.
    """


class ForcedStop(StopRequested):
    """Raised into a step that overran ``max_step_seconds`` while a stop was pending."""


class CheckWarning(UserWarning):
    """A check (or comparator) that only a resume in this same process can call again."""
