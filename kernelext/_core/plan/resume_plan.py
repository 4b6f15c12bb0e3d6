"""``kx.plan(run_id)``: what a resume of a run would do, computed without changing anything.

A :class:`ResumePlan` says: the run's status and reason; the completed steps (skipped on
resume) and the attempts that will run again; the next step; the effects replayed from
the ledger (counted per tool); the unknown effects that block the resume; open approvals
and questions; the facts re-checked first (with their age, and whether they look stale);
the credentials refreshed; for a run stopped in a ``run.map``, how many items are done and
which run again; code changes since the run ran (the agent's fingerprint, or
each ``%%agent`` cell's source); claims held; the deadline and the time left. It renders
as HTML in a notebook, as text (``str(plan)``) and as JSON (``plan.to_json()``).

``check_plan(plan)`` (``plan.verify()``) computes the plan again and raises
:class:`PlanChanged` with the difference when anything that matters moved since the
preview: another process resumed the run, a new effect became unknown, the code changed,
steps completed. ``kx.resume(run_id, plan=p)`` calls it before taking the run over.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from ..._formatting import counted, moment_text, step_label, step_numbers
from ..._shown import shows
from ..._store import Store
from ..._validate import (
    RUN_ID,
    STORE,
    check_count,
    check_duration,
    check_mapping,
    optional,
    register,
    validated,
)
from ...errors import PlanChanged, RunStateError
from ...status import LIVE, EffectStatus, StepStatus
from ..batch.view import stored_batch
from ..encoding.names import CELL_AGENT
from ..facts.facts import CONTRADICTIONS
from ..ledger.probes import probe_for
from ..process.checks import resolve
from ..process.lease import check_takeover
from ..process.runtime import get_store, runtime
from ..views.conversation import conversation_of, is_turn_step
from .code import agent_change, cell_changes, cell_state
from .items import (
    ClaimItem,
    CodeChange,
    CredentialItem,
    EffectItem,
    FactItem,
    NextStep,
    PlanData,
    RequestItem,
    StepItem,
)
from .render import CONVERSATION_GOES_ON, plan_dict, plan_html, plan_json, plan_text
from .rules import judge, plan_differences

FIRST_ITEM = "the first item not completed"

__all__ = [
    "STALE_AFTER",
    "ClaimItem",
    "CodeChange",
    "CredentialItem",
    "EffectItem",
    "FactItem",
    "NextStep",
    "PlanChanged",
    "RequestItem",
    "ResumePlan",
    "StepItem",
    "check_plan",
    "plan",
]

STALE_AFTER = 3600.0  # seconds: a fact recorded longer ago than this looks stale


class ResumePlan(PlanData):
    """What ``kx.resume(run_id)`` would do now (see :class:`PlanData` for the parts).

    Nothing was changed to find out. Display it in a notebook, print it, or
    ``.to_json()``; ``kx.resume(run_id, plan=p)`` resumes only as previewed.
    """

    @validated("ResumePlan.verify", store=STORE)
    def verify(self, store: Store | None = None) -> ResumePlan:
        """Compute the plan again; raise :class:`PlanChanged` if what matters moved."""
        return check_plan(self, store)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON values (times as ISO text, UTC)."""
        return plan_dict(self)

    @validated("ResumePlan.to_json", indent=optional(check_count))
    def to_json(self, indent: int | None = 2) -> str:
        return plan_json(self, indent)

    @shows
    def text(self) -> str:
        return plan_text(self)

    @shows
    def __str__(self) -> str:
        return plan_text(self)

    @shows
    def __repr__(self) -> str:
        return plan_text(self)

    def _repr_html_(self) -> str:
        return plan_html(self)


register(ResumePlan=ResumePlan)  # what kx.resume(plan=...) takes


# -- computing the plan ---------------------------------------------------------------------
@validated(
    "kx.plan",
    run_id=RUN_ID,
    store=STORE,
    stale_after=check_duration,
    cell_sources=optional(check_mapping),
)
def plan(
    run_id: str,
    store: Store | None = None,
    *,
    stale_after: float = STALE_AFTER,
    cell_sources: Mapping[str, str] | None = None,
) -> ResumePlan:
    """What resuming ``run_id`` would do now, without changing anything.

    ``stale_after`` (seconds): a fact recorded longer ago looks stale (a fact's own
    ``max_age``, where the store keeps one, wins). ``cell_sources``: for a ``%%agent``
    run, the current source of its cells by step key (default: the sources this process
    has seen run).
    """
    store = get_store(store)
    row = store.get_run(run_id)
    now = store.now()
    result = ResumePlan(
        run_id=run_id,
        agent=str(row["agent"]),
        status=str(row["status"]),
        reason=row.get("reason"),
        owner=row.get("owner"),
        computed_at=now,
        deadline=row.get("deadline"),
        total_steps=row.get("total_steps"),
    )
    cell_run = row["agent"] == CELL_AGENT
    sources = dict(cell_sources or {})
    if cell_run and cell_sources is None:
        rt = runtime()
        with rt.lock:
            sources = {k: v for (r, k), v in rt.cell_sources.items() if r == run_id}
    steps = store.steps(run_id)
    numbers = step_numbers(steps)  # by cell or item, not by attempt
    _steps(result, steps, cell_run, sources, numbers)
    batch = stored_batch(steps, store.events(run_id), now)
    result.batch = batch if batch is not None and batch.not_completed != 0 else None
    live = _liveness(result, row, now)
    _effects(result, store, live, numbers)
    _conversation(result, store)
    result.approvals, result.questions = open_requests(store, run_id, now)
    _facts(result, store, now, stale_after)
    if cell_run:
        result.code = cell_changes(result.completed, sources)
    else:
        result.code = [agent_change(result.agent, row.get("fingerprint"))]
    result.claims = [
        ClaimItem(c["resource"], c["amount"], c["claimed_at"])
        for c in store.claims(run_id, active=True)
    ]
    resumed = store.resumed_events(run_id)
    result.resumes, result.last_resume = len(resumed), (resumed[-1] if resumed else None)
    judge(result, live)
    return result


def _steps(
    result: ResumePlan,
    steps: list[dict[str, Any]],
    cell_run: bool,
    sources: Mapping[str, str],
    numbers: Mapping[int, int],
) -> None:
    done_keys = {s["key"] for s in steps if s["status"] == StepStatus.COMPLETED}
    for s in steps:
        item = StepItem(
            s["ordinal"],
            s["key"],
            s.get("name"),
            s["status"],
            s.get("duration_s"),
            number=numbers.get(int(s["ordinal"])),
        )
        if s["status"] == StepStatus.COMPLETED:
            note = "skipped"
            if cell_run:
                state = cell_state(s["key"], s.get("name"), sources)
                note = "source changed: reported, not re-run" if state == "changed" else note
            result.completed.append(_with_note(item, note))
        elif s["key"] not in done_keys and all(r.key != s["key"] for r in result.rerun):
            result.rerun.append(_with_note(item, f"{s['status']}: runs again"))
    result.completed.sort(key=lambda item: item.ordinal)
    result.rerun.sort(key=lambda item: item.ordinal)
    top = max((item.ordinal for item in result.completed), default=-1)
    counted_top = max((item.shown for item in result.completed), default=-1)
    if cell_run:
        waiting = [k for k in sources if k not in done_keys]
        note = (
            f"the next %%agent cell run: {', '.join(waiting)}"
            if waiting
            else "the next %%agent cell you run (completed cells are skipped)"
        )
        result.next_step = NextStep(top + 1, waiting[0] if waiting else None, note)
    elif result.rerun:
        first = result.rerun[0]
        result.next_step = NextStep(
            first.ordinal, first.key, f"{step_label(first.shown, first.key)} again"
        )
    elif result.total_steps is not None and len(result.completed) >= result.total_steps:
        result.next_step = NextStep(None, None, "no step left: the agent function finishes")
    else:
        label = step_label(counted_top + 1, total=result.total_steps)
        result.next_step = NextStep(top + 1, None, f"{label}: {FIRST_ITEM}")


def _conversation(result: ResumePlan, store: Store) -> None:
    """A run of model and tool calls without steps: ``the conversation continues after
    turn 7; 7 model calls and 3 tool calls are replayed from the ledger``."""
    step = result.next_step
    if result.total_steps is not None or step is None or not step.note.endswith(FIRST_ITEM):
        return
    if not _turns_only(result):  # a run of steps (LangGraph's supersteps): its steps say it
        return
    # Only calls with a recorded outcome are replayed: an unknown or pending one waits
    # for kx.reconcile, a failed one is asked again.
    rows = store.load_effects(result.run_id).values()
    talk = conversation_of(r for r in rows if r["status"] == EffectStatus.APPLIED)
    if talk.turns:
        note = (
            f"{CONVERSATION_GOES_ON} after turn {talk.turns}; "
            f"{counted(talk.turns, 'model call')} and {counted(talk.tool_calls, 'tool call')} "
            "are replayed from the ledger"
        )
        result.next_step = NextStep(step.ordinal, step.key, note)


def _turns_only(result: ResumePlan) -> bool:
    """No completed step, or only an agent framework's model turns (``turn 3``)."""
    return all(is_turn_step(str(item.key)) for item in result.completed)


def _shown(numbers: Mapping[int, int], ordinal: Any) -> int | None:
    return None if ordinal is None else numbers.get(int(ordinal), int(ordinal))


def _with_note(item: StepItem, note: str) -> StepItem:
    return dataclasses.replace(item, note=note)


def _liveness(result: ResumePlan, row: dict[str, Any], now: dt.datetime) -> str | None:
    """Where the run is live (``here`` or the other owner), or None when it is not."""
    if runtime().live_handle(result.run_id) is not None:
        return "here"
    if row["status"] not in LIVE:
        return None
    try:
        check_takeover(row, now)
    except RunStateError:
        return str(row.get("owner") or "another process")
    return None  # its owner is gone: a resume takes it over


def _effects(
    result: ResumePlan, store: Store, live: str | None, numbers: Mapping[int, int]
) -> None:
    done = {item.key for item in result.completed}
    rows = sorted(
        store.load_effects(result.run_id).values(),
        key=lambda e: (e["intent_at"], e["call_ordinal"]),
    )
    turns = _turns_only(result)  # a framework's run replays its completed turns
    for e in rows:
        tool, status = str(e["tool"]), str(e["status"])
        if e["step_key"] in done and not (turns and status == EffectStatus.APPLIED):
            result.skipped_effects[tool] = result.skipped_effects.get(tool, 0) + 1
        elif status == EffectStatus.APPLIED:
            result.replayed[tool] = result.replayed.get(tool, 0) + 1
        elif status == EffectStatus.NOT_APPLIED:
            result.called_again[tool] = result.called_again.get(tool, 0) + 1
        if status not in (EffectStatus.UNKNOWN, EffectStatus.PENDING):
            continue
        item = EffectItem(
            str(e["key"]),
            tool,
            str(e["step_key"]),
            status,
            e.get("args"),
            e.get("intent_at"),
            probe_for(tool) is not None,
            e.get("step_ordinal"),
            _shown(numbers, e.get("step_ordinal")),
        )
        # An intent without an outcome of a run nobody executes becomes unknown on take-over.
        if status == EffectStatus.PENDING and live is not None:
            result.in_flight.append(item)
        else:
            result.unknown.append(item)


def _facts(result: ResumePlan, store: Store, now: dt.datetime, stale_after: float) -> None:
    kept = {item.ordinal for item in result.completed}
    for row in store.fact_rows(result.run_id):
        if row["step_ordinal"] is not None and row["step_ordinal"] not in kept:
            continue
        if row["kind"] == "credential":
            result.credentials.append(CredentialItem(row["name"], _refresh_of(result, row)))
            continue
        check, _why = resolve(row["check_name"], run_id=result.run_id, fact=row["name"])
        age = max((now - row["recorded_at"]).total_seconds(), 0.0)
        limit = _max_age(row.get("max_age"), stale_after)
        last = row.get("check_status")
        reasons = []
        if last in CONTRADICTIONS:
            reasons.append(f"its last check said {last}")
        if age > limit:
            reasons.append("older than its max age")
        if check is None:
            reasons.append("its check cannot be found in this process")
        result.facts.append(
            FactItem(
                row["name"],
                row["step_ordinal"],
                row["recorded_at"],
                age,
                limit,
                last,
                check is not None,
                bool(reasons),
                "; ".join(reasons),
            )
        )


def _max_age(value: Any, default: float) -> float:
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    return default


def _refresh_of(result: ResumePlan, row: dict[str, Any]) -> str | None:
    if runtime().credentials.refresh_for(row["name"]) is not None:
        return "kx.credentials"
    if row.get("check_name"):
        fn, _why = resolve(
            row["check_name"], run_id=result.run_id, fact=row["name"], role="refresh"
        )
        if fn is not None:
            return str(row["check_name"])
    return None


# -- reads ----------------------------------------------------------------------------------
def open_requests(
    store: Store, run_id: str, now: dt.datetime
) -> tuple[list[RequestItem], list[RequestItem]]:
    """Open approval requests and open questions of the run (none where the store has none)."""
    approvals = [
        RequestItem("approval", _request_text(row, "tool"), row)
        for row in _store_rows(store, "open_approvals", run_id, now)
    ]
    questions = [
        RequestItem("question", _request_text(row, "prompt"), row)
        for row in _store_rows(store, "open_questions", run_id, now)
    ]
    return approvals, questions


def _store_rows(store: Store, method: str, run_id: str, now: dt.datetime) -> list[dict[str, Any]]:
    read = getattr(store, method, None)  # a store of a release without approvals has none
    return list(read(run_id, now)) if callable(read) else []


def _request_text(row: dict[str, Any], name: str) -> str:
    what = str(row.get(name) or "request")
    if row.get("step") is None and row.get("step_ordinal") is None:
        return what
    return f"{what} in {step_label(row.get('step_ordinal'), row.get('step'))}"


# -- resuming as previewed ----------------------------------------------------------------
def check_plan(previewed: ResumePlan, store: Store | None = None) -> ResumePlan:
    """Compute the plan of ``previewed.run_id`` again; raise :class:`PlanChanged` when
    anything that matters changed since the preview (nothing has run). Returns the new plan.
    """
    now = plan(previewed.run_id, store)
    differences = plan_differences(previewed, now)
    if differences:
        at = moment_text(previewed.computed_at)
        raise PlanChanged(
            f"Run {previewed.run_id!r} changed since its plan was previewed at {at}: "
            + "; ".join(differences)
            + f". Nothing was run. Look at the new plan with kx.plan({previewed.run_id!r}) "
            "and resume with that one.",
            differences,
            now,
        )
    return now
