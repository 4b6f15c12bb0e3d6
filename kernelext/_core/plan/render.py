"""How a resume plan shows: ``str(plan)`` (the command line), ``plan._repr_html_()`` (a
notebook cell, the panel, a notebook saved with nbconvert: no script, inline styles only)
and ``plan.to_json()``.

It only renders: what a plan holds is in ``kernelext._core.plan.items``, how it is
computed in ``kernelext._core.plan.resume_plan``, what blocks a resume in
``kernelext._core.plan.rules``.
Durations, times and step numbers read as everywhere else (``kernelext._formatting``),
colours are the shared ones (``kernelext._core.views.colours``).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import asdict, fields, is_dataclass
from typing import Any

from ..._formatting import counted, duration_text, moment_text, step_label
from ..._shown import shown_html
from ...status import StepStatus
from ..views.colours import BAD, BORDER, MUTED, OK, PAPER, WARN
from .items import UNSEEN, CodeChange, EffectItem, FactItem, PlanData

CONVERSATION_GOES_ON = "the conversation continues"  # a next step that is a sentence

__all__ = ["CONVERSATION_GOES_ON", "plan_dict", "plan_html", "plan_json", "plan_text"]

LISTED = 8  # items shown per section before "and N more"


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
def _counted(counts: dict[str, int]) -> list[str]:
    """``["post ×2, send ×1"]``; nothing for no calls (the row is left out)."""
    return [", ".join(f"{tool} ×{n}" for tool, n in sorted(counts.items()))] if counts else []


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def _deadline(plan: PlanData) -> list[str]:
    left = plan.time_left
    if plan.deadline is None or left is None:
        return []
    when = moment_text(plan.deadline)
    if left.total_seconds() < 0:
        return [
            f"{when}, overdue by {duration_text(left.total_seconds())} (the sweeper expires it)"
        ]
    return [f"{when}, in {duration_text(left.total_seconds())}"]


def _verdict(plan: PlanData) -> str:
    if plan.blockers:
        return "Blocked: " + "; ".join(plan.blockers) + "."
    nxt = plan.next_step.note if plan.next_step else "the next step"
    if nxt.startswith(CONVERSATION_GOES_ON):  # a whole sentence of its own
        return f"Ready: {nxt}."
    return f"Ready: a resume runs {nxt} next."


def _effect_line(e: EffectItem) -> str:
    when = f" intent {moment_text(e.intent_at)}" if e.intent_at else ""
    probe = ", probe registered" if e.probe else ""
    return f"{e.tool}({e.args or ''}) {e.step_text} key {e.key}{when}{probe}"


def _fact_line(f: FactItem) -> str:
    state = f"STALE ({f.why})" if f.stale else "fresh"
    age, most = duration_text(f.age_s), duration_text(f.max_age_s)
    return f"{f.name}: recorded {age} ago, max age {most}, {state}"


def _code_line(c: CodeChange) -> str:
    what = f"{c.kind} {c.name!r}"
    if c.state == "same":
        return f"{what}: unchanged ({c.current})"
    if c.state == UNSEEN:
        return f"{what}: unknown here (ran as {c.recorded or '-'})"
    return f"{what}: CHANGED {c.recorded} -> {c.current}"


def _batch_line(plan: PlanData) -> list[str]:
    """``run.map: 40 of 100 items done; a resume runs the 60 not completed (10 were in
    flight when it stopped: item-3, item-7, ...)``."""
    b = plan.batch
    if b is None:
        return []
    if b.total is None:
        head = f"{b.label}: {counted(b.done, 'item')} done; a resume runs the items not completed"
    else:
        left = b.not_completed or 0
        head = f"{b.label}: {b.done} of {counted(b.total, 'item')} done; a resume runs the {left}"
        head += " not completed"
    groups = [
        (b.stopped, "were in flight when it stopped", "was in flight when it stopped"),
        (b.running, "are in flight now", "is in flight now"),
        (
            b.abandoned,
            "were running when their process ended",
            "was running when its process ended",
        ),
        (b.failed, str(StepStatus.FAILED), str(StepStatus.FAILED)),
        (b.waiting, "wait for a person", "waits for a person"),
    ]
    told = [
        f"{len(keys)} {one if len(keys) == 1 else many}: {_listed(list(keys))}"
        for keys, many, one in groups
        if keys
    ]
    return [head + (f" ({'; '.join(told)})" if told else "")]


def _sections(plan: PlanData) -> list[tuple[str, list[str]]]:
    """(label, lines) in the order both renderings use; a row with no lines is left out
    (a person reads what is there, never a row of "none")."""
    done = [
        step_label(s.shown, s.key) + (f" ({s.note})" if s.note != "skipped" else "")
        for s in plan.completed
    ]
    creds = [
        f"{c.name} (from {c.refresh})" if c.refresh else f"{c.name}: NO REFRESH HERE"
        for c in plan.credentials
    ]
    claims = [
        c.resource + (f" ({c.amount:g})" if c.amount is not None else "") for c in plan.claims
    ]
    code = [_code_line(c) for c in plan.code if c.kind == "agent" or c.state != "same"]
    steps = f"{len(done)}: {_listed(done)}" if done else ""
    sections = [
        ("skipped (completed steps)", [steps] if steps else []),
        ("batch", _batch_line(plan)),
        ("runs again", [f"{step_label(s.shown, s.key)} ({s.note})" for s in plan.rerun]),
        ("next step", [plan.next_step.note] if plan.next_step else []),
        ("replayed from the ledger", _counted(plan.replayed)),
        ("called again (decided not applied)", _counted(plan.called_again)),
        ("skipped with their steps", _counted(plan.skipped_effects)),
        ("unknown effects", [_effect_line(e) for e in plan.unknown]),
        ("in flight", [_effect_line(e) for e in plan.in_flight]),
        ("open approvals", [r.summary for r in plan.approvals]),
        ("open questions", [r.summary for r in plan.questions]),
        ("facts re-checked", [_fact_line(f) for f in plan.facts]),
        ("credentials refreshed", creds),
        ("code", code or ["not known in this process"]),
        ("claims held", claims),
        ("deadline", _deadline(plan)),
    ]
    return [(label, lines) for label, lines in sections if lines]


def _header(plan: PlanData) -> str:
    why = f" ({plan.reason})" if plan.reason else ""
    return f"Resume plan for run {plan.run_id} [{plan.agent}]: {plan.status}{why}"


# -- text -----------------------------------------------------------------------------------
def plan_text(plan: PlanData) -> str:
    lines = [
        _header(plan) + f", computed {moment_text(plan.computed_at)}",
        "  " + _verdict(plan),
    ]
    for label, items in _sections(plan):
        if len(items) == 1:
            lines.append(f"  {label}: {items[0]}")
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
    return shown_html(text)


def _item_html(item: str) -> str:
    if any(word in item for word in ("STALE", "CHANGED", "NO REFRESH")):
        return f"<span style='color:{WARN}'>{_e(item)}</span>"
    return _e(item)


def plan_html(plan: PlanData) -> str:
    colour = OK if plan.ready else BAD
    rows = []
    for label, items in _sections(plan):
        bad = label.startswith(("unknown effects", "open "))
        style = f"color:{BAD};" if bad else ""
        cell = "<br>".join(_item_html(item) for item in items)
        rows.append(
            f"<tr><th style='text-align:left;vertical-align:top;padding:2px 10px 2px 0;"
            f"font-weight:600;white-space:nowrap;{style}'>{_e(label)}</th>"
            f"<td style='padding:2px 0;text-align:left;vertical-align:top'>{cell}</td></tr>"
        )
    diffs = "".join(
        f"<div style='margin-top:6px'>diff of {_e(c.kind)} <code>{_e(c.name)}</code>:"
        f"<pre style='margin:2px 0;padding:4px;background:{PAPER};font-size:11px'>"
        f"{_e(c.diff)}</pre></div>"
        for c in plan.code
        if c.diff
    )
    warnings = "".join(f"<div style='color:{WARN}'>⚠ {_e(w)}</div>" for w in plan.warnings)
    return (
        "<div class='kernelext-plan' style='font-family:system-ui,sans-serif;font-size:13px;"
        f"border:1px solid {BORDER};border-radius:6px;padding:8px 12px;max-width:820px'>"
        f"<div style='font-weight:600'>{_e(_header(plan))}"
        f" <span style='color:{MUTED};font-weight:400'>computed "
        f"{_e(moment_text(plan.computed_at))}</span></div>"
        f"<div style='color:{colour};margin:4px 0'>{_e(_verdict(plan))}</div>"
        # aligned the same inside a panel and on its own (JupyterLab centres tables and
        # right-aligns their cells unless told)
        f"<table style='border-collapse:collapse;margin:0'>{''.join(rows)}</table>"
        f"{diffs}{warnings}</div>"
    )
