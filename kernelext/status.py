"""The run lifecycle in one place: statuses, their groups, reasons, and the transition table.

Every status change is checked against ``TRANSITIONS``, writes an ``events`` row, and
sets the deadline of a waiting status from the expiry policy. The members are ``str``
(``Status.RUNNING == "running"``), so rows read back from SQL (``kx.sql``) compare equal
to them.

::

                 stop             suspend / stop lands
    running ───────────► stopping ─────────────────► suspended ──expire──► expired
       │  ▲                  │                          │
       │  └──── resume / take over (also from failed, needs_decision,
       │        and a dead owner's running / stopping) ─┘
       ├─ completed ─ failed ─ needs_decision ─ cancelled (from running or stopping)
       └─ needs_decision ──decide──► running · cancelled (give up) · expired
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from .errors import RunStateError as _RunStateError  # kernelext.errors is its home

__all__ = [
    "FINAL",
    "LIVE",
    "RESUMABLE",
    "TERMINAL",
    "TRANSITIONS",
    "WAITING",
    "EffectStatus",
    "Reason",
    "Status",
    "StepStatus",
    "check_transition",
    "statuses",
    "waiting_reason",
]


class _Str(str, enum.Enum):
    """A ``str`` member that prints and binds as its value (Python 3.10 has no StrEnum)."""

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:  # shown inside lists and dicts as the plain string it is
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Status(_Str):
    """The status of a run (``runs.status``)."""

    RUNNING = "running"
    STOPPING = "stopping"  # a stop was asked for; it lands at the next safe point
    SUSPENDED = "suspended"
    NEEDS_DECISION = "needs_decision"  # a person must decide (an unknown effect, a fact)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class StepStatus(_Str):
    """The status of one step attempt (``steps.status``)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped (or forced) before it completed
    ABANDONED = "abandoned"  # left running by a process that is gone
    SUPERSEDED = "superseded"  # a later attempt replaced it (kx.revalidation replan)


class EffectStatus(_Str):
    """The status of one effect in the ledger (``effects.status``)."""

    PENDING = "pending"  # the intent is durable, the outcome not yet
    APPLIED = "applied"
    FAILED = "failed"
    UNKNOWN = "unknown"  # nobody knows whether it happened: a person reconciles it
    NOT_APPLIED = "not_applied"
    GIVEN_UP = "given_up"  # a person gave up on it (kx.reconcile); the run was cancelled


class Reason(_Str):
    """Why a run waits; each has its own expiry duration (``ExpiryPolicy``)."""

    USER_STOP = "user_stop"
    APPROVAL = "approval"
    INPUT = "input"
    DECISION = "decision"  # needs_decision: waiting for someone to reconcile
    RATE_LIMIT = "rate_limit"
    ERROR = "error"
    RESTART = "restart"  # a run made by kx.restart, waiting for its first resume
    OTHER = "other"


LIVE = frozenset({Status.RUNNING, Status.STOPPING})
WAITING = frozenset({Status.SUSPENDED, Status.NEEDS_DECISION})
# What kx.resume accepts: waiting runs, failed runs, and live ones whose owner is gone.
RESUMABLE = frozenset({*WAITING, Status.FAILED, *LIVE})
# Runs that will not execute again by themselves (claims are released on entering them).
FINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.EXPIRED})
# Runs that can never run again (kx.restart starts a new run from their snapshot).
TERMINAL = frozenset({Status.COMPLETED, Status.CANCELLED, Status.EXPIRED})

# from -> the statuses it may move to. ``None`` is "no run yet" (creation).
TRANSITIONS: dict[Status | None, frozenset[Status]] = {
    None: frozenset({Status.RUNNING}),
    Status.RUNNING: frozenset(
        {
            Status.RUNNING,  # a take-over of a run whose owner is gone
            Status.STOPPING,
            Status.SUSPENDED,
            Status.NEEDS_DECISION,
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
        }
    ),
    Status.STOPPING: frozenset(
        {
            Status.RUNNING,  # a take-over of a run whose owner is gone
            Status.SUSPENDED,
            Status.NEEDS_DECISION,
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
        }
    ),
    Status.SUSPENDED: frozenset(
        {
            Status.RUNNING,
            Status.NEEDS_DECISION,  # a record of it was refused by the store
            Status.COMPLETED,  # a %%agent run whose cells are done
            Status.CANCELLED,
            Status.EXPIRED,
        }
    ),
    Status.NEEDS_DECISION: frozenset(
        {Status.RUNNING, Status.NEEDS_DECISION, Status.CANCELLED, Status.EXPIRED}
    ),
    Status.FAILED: frozenset({Status.RUNNING, Status.NEEDS_DECISION, Status.CANCELLED}),
    Status.COMPLETED: frozenset(),
    Status.CANCELLED: frozenset(),
    Status.EXPIRED: frozenset(),
}


def check_transition(run_id: str, before: str, after: str) -> None:
    """Refuse a move the table does not list, saying what the run is and what it can do."""
    allowed = TRANSITIONS.get(Status(before), frozenset())
    if Status(after) in allowed:
        return
    can = ", ".join(sorted(allowed)) or "nothing: it is final"
    raise _RunStateError(
        f"Run {run_id!r} cannot move from {before} to {after}; from {before} it can move to "
        f"{can}. To run it again from a snapshot, use kx.restart({run_id!r})."
    )


def waiting_reason(status: str, reason: str | None) -> str:
    """The expiry reason of a waiting run: ``decision`` for needs_decision, else its reason."""
    if status == Status.NEEDS_DECISION:
        return Reason.DECISION
    return reason or Reason.OTHER


def statuses(names: Iterable[str]) -> tuple[Status, ...]:
    """Validate status names (for example from a command line)."""
    return tuple(Status(name) for name in names)
