"""What a resume plan is made of: :class:`PlanData` and its items (steps, effects,
requests, facts, credentials, code changes, claims, the batch it stopped in).

``kernelext._core.plan.resume_plan`` computes a plan from the store (its :class:`ResumePlan`
adds how it shows), ``kernelext._core.plan.rules`` decides what blocks or warns,
``kernelext._core.plan.render`` shows it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..._formatting import step_label
from ..batch.view import StoredBatch

__all__ = [
    "UNSEEN",
    "ClaimItem",
    "CodeChange",
    "CredentialItem",
    "EffectItem",
    "FactItem",
    "NextStep",
    "PlanData",
    "RequestItem",
    "StepItem",
]

UNSEEN = "unseen"  # a code change's state when the code that would run is not known here


@dataclass(frozen=True)
class StepItem:
    ordinal: int
    key: str
    name: str | None
    status: str
    duration_s: float | None
    note: str = ""  # "skipped", "cancelled: runs again", "source changed: ..."
    number: int | None = None  # the ordinal as a person counts it (by cell or item)

    @property
    def shown(self) -> int:
        """The ordinal a person reads (``step_label``): by cell or item, not by attempt."""
        return self.ordinal if self.number is None else self.number


@dataclass(frozen=True)
class NextStep:
    ordinal: int | None
    key: str | None  # None: the agent decides (the item after the last completed step)
    note: str


@dataclass(frozen=True)
class EffectItem:
    key: str
    tool: str
    step_key: str
    status: str
    args: str | None  # as stored (secrets redacted)
    intent_at: dt.datetime | None
    probe: bool  # a probe is registered for its tool in this process
    step_ordinal: int | None = None
    step_number: int | None = None  # its step's ordinal as a person counts it

    @property
    def step_text(self) -> str:
        """``step 2 (fetch)``: its step, as every surface shows it."""
        shown = self.step_ordinal if self.step_number is None else self.step_number
        return step_label(shown, self.step_key)


@dataclass(frozen=True)
class RequestItem:
    kind: str  # "approval" or "question"
    summary: str
    row: dict[str, Any]


@dataclass(frozen=True)
class FactItem:
    name: str
    step_ordinal: int | None
    recorded_at: dt.datetime
    age_s: float
    max_age_s: float
    last_check: str | None
    checkable: bool  # its check can be found in this process
    stale: bool
    why: str


@dataclass(frozen=True)
class CredentialItem:
    name: str
    refresh: str | None  # where the fresh value comes from; None: nothing found here


@dataclass(frozen=True)
class CodeChange:
    kind: str  # "agent" or "cell"
    name: str
    recorded: str | None  # fingerprint (agent) or source hash (cell) the run ran with
    current: str | None  # the same of the code defined now (None: not known here)
    state: str  # "same", "changed" or UNSEEN (the code running it now is not known here)
    diff: str = ""  # a short unified diff, when both sources were seen in this process


@dataclass(frozen=True)
class ClaimItem:
    resource: str
    amount: float | None
    claimed_at: dt.datetime | None


@dataclass
class PlanData:
    """What a resume of the run would do, as computed at ``computed_at`` (store clock, UTC)."""

    run_id: str
    agent: str
    status: str
    reason: str | None
    owner: str | None
    computed_at: dt.datetime
    deadline: dt.datetime | None
    total_steps: int | None
    completed: list[StepItem] = field(default_factory=list)  # skipped on resume
    rerun: list[StepItem] = field(default_factory=list)  # attempts not completed: run again
    next_step: NextStep | None = None
    replayed: dict[str, int] = field(default_factory=dict)  # tool -> applied, replayed
    called_again: dict[str, int] = field(default_factory=dict)  # tool -> not_applied
    skipped_effects: dict[str, int] = field(default_factory=dict)  # tool -> in completed steps
    in_flight: list[EffectItem] = field(default_factory=list)  # intents of a live run
    unknown: list[EffectItem] = field(default_factory=list)  # block the resume
    approvals: list[RequestItem] = field(default_factory=list)
    questions: list[RequestItem] = field(default_factory=list)
    facts: list[FactItem] = field(default_factory=list)  # re-checked before the first action
    credentials: list[CredentialItem] = field(default_factory=list)  # refreshed first
    code: list[CodeChange] = field(default_factory=list)
    claims: list[ClaimItem] = field(default_factory=list)
    batch: StoredBatch | None = None  # the run.map it stopped in: items done, items to run
    resumes: int = 0  # times the run was taken over so far
    last_resume: dict[str, Any] | None = None
    blockers: list[str] = field(default_factory=list)  # why a resume would not run a step now
    warnings: list[str] = field(default_factory=list)  # why it may stop after the take-over

    @property
    def ready(self) -> bool:
        """True when a resume would run the next step at once (nothing blocks it)."""
        return not self.blockers

    @property
    def time_left(self) -> dt.timedelta | None:
        """Time until the deadline, from when the plan was computed (negative: overdue)."""
        return None if self.deadline is None else self.deadline - self.computed_at

    @property
    def code_changed(self) -> bool:
        return any(change.state == "changed" for change in self.code)
