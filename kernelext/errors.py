"""Errors raised by kernelext. Every message says what happened and what to do."""

from __future__ import annotations

import datetime as dt

from ._did_you_mean import did_you_mean
from ._formatting import moment_text

__all__ = [
    "AgentError",
    "ClaimConflict",
    "CodeChangedError",
    "EffectArgumentsMismatch",
    "EffectRejected",
    "ForcedStop",
    "ForeignStoreError",
    "IntegrityError",
    "InvalidName",
    "KernelextError",
    "LedgerError",
    "NameNotText",
    "NeedsDecision",
    "OwnershipLost",
    "ReadOnlyError",
    "ResultNotStorable",
    "RunNotFound",
    "RunStateError",
    "SchemaTooNewError",
    "SerializationError",
    "StopRequested",
    "StoreError",
    "StoreLockedError",
    "StoreWriteError",
    "UnencodableArgument",
    "did_you_mean",
]


class KernelextError(Exception):
    """Base class of every error kernelext raises on purpose."""


class StoreError(KernelextError):
    """The store cannot be opened, read or written."""


class StoreLockedError(StoreError):
    """Another process holds the store file."""

    def __init__(self, path: str, pid: int | None, detail: str = "") -> None:
        self.path = path
        self.pid = pid
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"The kernelext store {path!r} is held by {holder}. DuckDB allows one process "
            "per file. Stop that process (or its notebook kernel), or point this process at "
            "its own store with KERNELEXT_STORE=/path/to/other.duckdb "
            "(in a notebook: %config Kernelext.store = '...')." + (f" [{detail}]" if detail else "")
        )


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
        when = f" since {moment_text(since)}" if isinstance(since, dt.datetime) else ""
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


class CodeChangedError(RunStateError):
    """The agent's code differs from the code that started the run."""


class ClaimConflict(RunStateError):
    """A resource is already claimed by another live or suspended run."""


class AgentError(KernelextError):
    """The agent is not defined or not usable in this process."""


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
