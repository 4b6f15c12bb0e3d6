"""A resume plan as data (its items and :class:`PlanData`) and as text, HTML and JSON.

``kernelext._core.plan`` computes a plan and checks it again before a resume; this module
holds what a plan is made of and how it shows: ``str(plan)`` (the command line),
``plan._repr_html_()`` (a notebook cell, the panel, a notebook saved with nbconvert: no
script, inline styles only) and ``plan.to_json()``.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import uuid
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from .._validate import check_count, optional, validated
from ..status import TERMINAL
from .facts import CONTRADICTIONS

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
    "judge",
    "plan_dict",
    "plan_differences",
    "plan_html",
    "plan_json",
    "plan_text",
    "span_text",
]

UNSEEN = "unseen"  # a code change's state when the code that would run is not known here
LISTED = 8  # items shown per section before "and N more"
OK, BAD, WARN, MUTED = "#1a7f37", "#cf222e", "#9a6700", "#57606a"


@dataclass(frozen=True)
class StepItem:
    ordinal: int
    key: str
    name: str | None
    status: str
    duration_s: float | None
    note: str = ""  # "skipped", "cancelled: runs again", "source changed: ..."


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

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON values (times as ISO text, UTC)."""
        return plan_dict(self)

    @validated("ResumePlan.to_json", indent=optional(check_count))
    def to_json(self, indent: int | None = 2) -> str:
        return plan_json(self, indent)

    def text(self) -> str:
        return plan_text(self)

    def __str__(self) -> str:
        return plan_text(self)

    def __repr__(self) -> str:
        return plan_text(self)

    def _repr_html_(self) -> str:
        return plan_html(self)


# -- what a plan means ------------------------------------------------------------------------
def judge(result: PlanData, live: str | None) -> None:
    """Fill ``blockers`` (a resume would not get going now: it is refused, or stops for a
    person) and ``warnings`` (it may stop after taking the run over). ``live``: where the
    run executes (``here``, or its owner elsewhere), None when nobody executes it."""
    rid = result.run_id
    if result.status in TERMINAL:
        result.blockers.append(f"the run is {result.status}: it cannot be resumed")
    if live == "here":
        result.blockers.append("the run is executing in this process")
    elif live is not None:
        result.blockers.append(f"the run is live in {live}")
    if result.unknown:
        probed = sum(item.probe for item in result.unknown)
        asked = f" ({probed} with a probe, asked first)" if probed else ""
        result.blockers.append(
            f"{len(result.unknown)} effect(s) with an unknown outcome{asked} wait for a "
            f"decision: kx.reconcile({rid!r})"
        )
    if result.approvals:
        result.blockers.append(
            f"{len(result.approvals)} open approval request(s): decide with kx.approvals({rid!r})"
        )
    if result.questions:
        result.blockers.append(
            f"{len(result.questions)} open question(s): answer with kx.answer({rid!r}, value)"
        )
    for change in result.code:
        if change.kind == "agent" and change.state == UNSEEN:
            result.blockers.append(
                f"agent {change.name!r} is not defined in this process: run the code that "
                "defines it first"
            )
        elif change.kind == "agent" and change.state == "changed":
            result.blockers.append(
                f"the code of agent {change.name!r} changed ({change.recorded} -> "
                f"{change.current}): resume refuses unless allow_code_change=True"
            )
    for cred in result.credentials:
        if cred.refresh is None:
            result.warnings.append(
                f"credential {cred.name!r} has no refresh function here: the resume stops "
                f"(register one with kx.credentials.register({cred.name!r}, refresh=fn))"
            )
    bad = [f.name for f in result.facts if not f.checkable or f.last_check in CONTRADICTIONS]
    if bad:
        result.warnings.append(
            f"fact(s) {', '.join(bad)} may not hold: the resume may stop for a decision"
        )


def plan_differences(before: PlanData, after: PlanData) -> list[str]:
    """What changed between two plans of the same run, in words (empty: nothing that matters)."""
    found = []
    if before.status != after.status:
        found.append(f"status {before.status} -> {after.status}")
    if before.owner != after.owner:
        found.append(f"owner {before.owner} -> {after.owner}")
    if after.resumes > before.resumes:
        who = (after.last_resume or {}).get("actor") or "another process"
        found.append(f"resumed {after.resumes - before.resumes} time(s) in between, by {who}")
    new_steps = [s.key for s in after.completed if s.key not in {b.key for b in before.completed}]
    if new_steps:
        found.append(f"{len(new_steps)} step(s) completed since: {', '.join(new_steps[:5])}")
    old_unknown = {e.key for e in before.unknown}
    fresh = [e for e in after.unknown if e.key not in old_unknown]
    if fresh:
        shown = ", ".join(f"{e.tool} in step {e.step_key!r}" for e in fresh[:5])
        found.append(f"{len(fresh)} new effect(s) with an unknown outcome: {shown}")
    old_code = {(c.kind, c.name): c.current for c in before.code}
    for change in after.code:
        previous = old_code.get((change.kind, change.name))
        if None not in (previous, change.current) and change.current != previous:
            found.append(
                f"the code of {change.kind} {change.name!r} changed since the preview "
                f"({previous} -> {change.current})"
            )
    return found


# -- JSON ---------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def plan_dict(plan: PlanData) -> dict[str, Any]:
    data: dict[str, Any] = _plain(asdict(plan))
    left = plan.time_left
    data.update(ready=plan.ready, time_left_s=None if left is None else left.total_seconds())
    return data


def plan_json(plan: PlanData, indent: int | None = 2) -> str:
    return json.dumps(plan_dict(plan), indent=indent, sort_keys=True)


# -- words ----------------------------------------------------------------------------------
def span_text(seconds: float) -> str:
    """``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{tool} ×{n}" for tool, n in sorted(counts.items())) or "none"


def _counted(counts: dict[str, int]) -> list[str]:
    return [_counts(counts)] if counts else []


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def _deadline(plan: PlanData) -> str:
    left = plan.time_left
    if plan.deadline is None or left is None:
        return "none"
    when = f"{plan.deadline:%Y-%m-%d %H:%M} UTC"
    if left.total_seconds() < 0:
        return f"{when}, overdue by {span_text(left.total_seconds())} (the sweeper expires it)"
    return f"{when}, in {span_text(left.total_seconds())}"


def _verdict(plan: PlanData) -> str:
    if plan.blockers:
        return "Blocked: " + "; ".join(plan.blockers) + "."
    nxt = plan.next_step.note if plan.next_step else "the next step"
    return f"Ready: a resume runs {nxt} next."


def _effect_line(e: EffectItem) -> str:
    when = f" intent {e.intent_at:%Y-%m-%d %H:%M:%S}" if e.intent_at else ""
    probe = ", probe registered" if e.probe else ""
    return f"{e.tool}({e.args or ''}) step {e.step_key!r} key {e.key}{when}{probe}"


def _fact_line(f: FactItem) -> str:
    state = f"STALE ({f.why})" if f.stale else "fresh"
    return f"{f.name}: recorded {span_text(f.age_s)} ago, max age {span_text(f.max_age_s)}, {state}"


def _code_line(c: CodeChange) -> str:
    what = f"{c.kind} {c.name!r}"
    if c.state == "same":
        return f"{what}: unchanged ({c.current})"
    if c.state == UNSEEN:
        return f"{what}: unknown here (ran as {c.recorded or '-'})"
    return f"{what}: CHANGED {c.recorded} -> {c.current}"


def _sections(plan: PlanData) -> list[tuple[str, list[str], bool]]:
    """(label, lines, shown even when empty) in the order both renderings use."""
    done = [s.key + (f" ({s.note})" if s.note != "skipped" else "") for s in plan.completed]
    creds = [
        f"{c.name} (from {c.refresh})" if c.refresh else f"{c.name}: NO REFRESH HERE"
        for c in plan.credentials
    ]
    claims = [
        c.resource + (f" ({c.amount:g})" if c.amount is not None else "") for c in plan.claims
    ]
    code = [_code_line(c) for c in plan.code if c.kind == "agent" or c.state != "same"]
    steps = f"{len(done)}: {_listed(done)}" if done else ""
    return [
        ("skipped (completed steps)", [steps] if steps else [], True),
        ("runs again", [f"{s.key} ({s.note})" for s in plan.rerun], False),
        ("next step", [plan.next_step.note if plan.next_step else "-"], True),
        ("replayed from the ledger", _counted(plan.replayed), True),
        ("called again (decided not applied)", _counted(plan.called_again), False),
        ("skipped with their steps", _counted(plan.skipped_effects), False),
        ("unknown effects", [_effect_line(e) for e in plan.unknown], True),
        ("in flight", [_effect_line(e) for e in plan.in_flight], False),
        ("open approvals", [r.summary for r in plan.approvals], True),
        ("open questions", [r.summary for r in plan.questions], True),
        ("facts re-checked", [_fact_line(f) for f in plan.facts], True),
        ("credentials refreshed", creds, True),
        ("code", code or ["not known in this process"], True),
        ("claims held", claims, True),
        ("deadline", [_deadline(plan)], True),
    ]


def _header(plan: PlanData) -> str:
    why = f" ({plan.reason})" if plan.reason else ""
    return f"Resume plan for run {plan.run_id} [{plan.agent}]: {plan.status}{why}"


# -- text -----------------------------------------------------------------------------------
def plan_text(plan: PlanData) -> str:
    lines = [
        _header(plan) + f", computed {plan.computed_at:%Y-%m-%d %H:%M:%S} UTC",
        "  " + _verdict(plan),
    ]
    for label, items, always in _sections(plan):
        if not items and not always:
            continue
        if len(items) <= 1:
            lines.append(f"  {label}: {items[0] if items else 'none'}")
            continue
        lines.append(f"  {label} ({len(items)}):")
        lines.extend(f"    - {item}" for item in items)
    for change in plan.code:
        if change.diff:
            lines.append(f"  diff of {change.kind} {change.name!r}:")
            lines.extend("    " + line for line in change.diff.splitlines())
    lines.extend(f"  warning: {w}" for w in plan.warnings)
    return "\n".join(lines)


# -- HTML -----------------------------------------------------------------------------------
def _e(text: Any) -> str:
    return html.escape(str(text))


def _item_html(item: str) -> str:
    if any(word in item for word in ("STALE", "CHANGED", "NO REFRESH")):
        return f"<span style='color:{WARN}'>{_e(item)}</span>"
    return _e(item)


def plan_html(plan: PlanData) -> str:
    colour = OK if plan.ready else BAD
    rows = []
    for label, items, always in _sections(plan):
        if not items and not always:
            continue
        bad = label.startswith(("unknown effects", "open ")) and items
        style = f"color:{BAD};" if bad else ""
        cell = "<br>".join(_item_html(item) for item in items)
        cell = cell or f"<span style='color:{MUTED}'>none</span>"
        rows.append(
            f"<tr><th style='text-align:left;vertical-align:top;padding:2px 10px 2px 0;"
            f"font-weight:600;white-space:nowrap;{style}'>{_e(label)}</th>"
            f"<td style='padding:2px 0'>{cell}</td></tr>"
        )
    diffs = "".join(
        f"<div style='margin-top:6px'>diff of {_e(c.kind)} <code>{_e(c.name)}</code>:"
        f"<pre style='margin:2px 0;padding:4px;background:#f6f8fa;font-size:11px'>"
        f"{_e(c.diff)}</pre></div>"
        for c in plan.code
        if c.diff
    )
    warnings = "".join(f"<div style='color:{WARN}'>⚠ {_e(w)}</div>" for w in plan.warnings)
    return (
        "<div class='kernelext-plan' style='font-family:system-ui,sans-serif;font-size:13px;"
        "border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;max-width:820px'>"
        f"<div style='font-weight:600'>{_e(_header(plan))}"
        f" <span style='color:{MUTED};font-weight:400'>computed "
        f"{plan.computed_at:%H:%M:%S} UTC</span></div>"
        f"<div style='color:{colour};margin:4px 0'>{_e(_verdict(plan))}</div>"
        f"<table style='border-collapse:collapse'>{''.join(rows)}</table>"
        f"{diffs}{warnings}</div>"
    )
