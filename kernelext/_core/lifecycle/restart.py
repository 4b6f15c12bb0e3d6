"""``kx.restart(run_id, from_step=None)``: a new run forked from a kept snapshot.

The new run (new id, ``parent_id`` = the old run) starts from the state after the
steps it carries over:

* ``from_step=None``: after the last completed step;
* ``from_step=N`` (an int): at step ordinal ``N`` (0-based, as in the ``steps``
  table): steps ``0 .. N-1`` are carried over, the state is the one after step
  ``N-1``, and step ``N`` and every later one run again;
* ``from_step="key"`` (a str): at the completed step with that key (it runs again).

**Every applied effect of the old run is carried over**, whatever step made it: the
completed steps', the effects of the step that was in progress when the run stopped
(suspended for an approval that expired, failed with an error, was force-stopped or
its process died), those of steps at or after ``from_step`` that run again, and calls
made outside any step. Each is copied into the new run's ledger under the key the new
run computes for the same call (``ledger.effect_key`` of the new run id, step key,
tool and call ordinal), so the step that runs again replays it (its recorded result
comes back) and never repeats it. A replayed call with other arguments stops with
``EffectArgumentsMismatch``, as after ``replan``. The effects the old run carried from
its own parent are in its ledger, so a restart of a restart carries them on.

Effects that did not happen are not carried and are called again: ``failed`` ones
(a resumable effect that failed: restarting is the deliberate retry) and ``not_applied``
ones (a person said it did not happen); the ``created`` event of the new run lists them
(``called_again``). A ``failed`` call that may have reached its target is not among
them: a tool without ``idempotency_key`` answered with an error after its request left
(the retry rule's ``effect_reached`` event, ``kernelext._core.ledger.retries``) is carried as
``unknown``, like a ``given_up`` one below, so it waits for a decision instead of being
sent again. The ``idempotency_key`` handed to the tool is the same in every run
of the restart chain (``ledger.idempotency_key_for``: the key of the call in the chain's
root run), so an API that dedupes by key dedupes such a call. A ``given_up`` effect (a
person gave up on the old run without saying whether it happened) is carried as
``unknown``: the new run stops in ``needs_decision`` at its take-over and a person
decides it there with ``kx.reconcile`` of the new run. Refused while the old run has
effects with an unknown outcome (``unknown``/``pending``, or a ``resumable=False`` call
that failed and may have half-happened, which becomes ``unknown`` as on a resume):
reconcile them first, and a ``mark_applied`` decision is carried with its result like
any applied effect. Answered ``run.ask`` questions are carried too (re-keyed through
``keys.question_key``), so a step that runs again gets the answer back.

Facts recorded before the restart point are copied and revalidated by the ordinary
resume path, which the new run goes through. Claims the old run held are taken again
by the new run. Also refused when the old run is still executing, or when a needed
snapshot was removed after the retention period (``run.map`` items take none: the state
after an item is the one of the step before the batch). **A restarted run is superseded**:
restarting it again, or resuming it (a ``failed`` run stays ``failed`` but can no longer
be resumed), is refused with the child's id and what to do (``kx.resume('<child>')`` /
``kx.restart('<child>')``), decided in the restart transaction (two racing restarts:
one wins) and in the take-over of every resume. A run that is ``suspended`` or
``needs_decision`` is also cancelled (claims released) in the transaction that creates
the new run. The new id is checked free before any payload file is linked, and a
refused restart removes only files it created itself.

A run made of ``%%agent`` cells restarts too (no
agent function to check: the notebook's cells are its code): run the cells again under
the new run id (``%%agent <old id>-restart1``); completed cells are skipped and the
cell that was in progress replays what the old run applied.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from ..._formatting import moment_text
from ..._store import Store, actor
from ..._store.restart import ENDED, SUPERSEDABLE, RestartPlan, superseded_error
from ..._validate import (
    FLAG,
    OPTIONAL_RUN_ID,
    RUN_ID,
    SOURCE,
    STORE,
    check_args_tuple,
    check_mapping,
    check_step,
    optional,
    validated,
)
from ...errors import RunStateError
from ...status import EffectStatus
from ..encoding.keys import effect_key, question_key
from ..encoding.names import CELL_AGENT, check_stored_name
from ..ledger.retries import REACHED_EVENT
from ..process.runtime import get_store, runtime
from .control import resume
from .handle import Handle
from .resume import agent_for

__all__ = ["restart"]


@validated(
    "kx.restart",
    run_id=RUN_ID,
    from_step=optional(check_step),
    new_run_id=OPTIONAL_RUN_ID,
    store=STORE,
    allow_code_change=FLAG,
    args=optional(check_args_tuple),
    kwargs=optional(check_mapping),
    source=SOURCE,
)
def restart(
    run_id: str,
    from_step: int | str | None = None,
    *,
    new_run_id: str | None = None,
    store: Store | None = None,
    allow_code_change: bool = False,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    source: str = "api",
) -> Handle:
    """Fork run ``run_id`` into a new run from a kept snapshot, and start it."""
    if new_run_id is not None:
        check_stored_name(
            new_run_id, "new run id", hint="Pass kx.restart(..., new_run_id='orders-2')."
        )
    store = get_store(store)
    row = store.get_run(run_id)
    _check_restartable(store, run_id, row, allow_code_change)
    steps = store.restart_steps(run_id)
    start = _start_ordinal(run_id, steps, from_step)
    carried = [s for s in steps if s["ordinal"] < start]
    _check_snapshots(run_id, carried)
    cutoff: dt.datetime | None = max((s["ended_at"] for s in carried), default=None)
    effects = list(store.load_effects(run_id).values())
    reached = {
        str(json.loads(e["detail"] or "{}").get("key"))
        for e in store.events(run_id)
        if e["kind"] == REACHED_EVENT
    }
    new_id = check_stored_name(new_run_id or _next_child_id(store, run_id), "new run id")
    scheme = row.get("key_scheme") or 1
    if store.find_run(new_id):  # before any payload file is linked for it
        raise RunStateError(
            f"A run {new_id!r} already exists; pass another new_run_id to kx.restart."
        )
    who = actor()
    plan = RestartPlan(
        old_id=run_id,
        new_id=new_id,
        start_ordinal=start,
        steps=carried,
        effects=_carried_effects(effects, run_id, new_id, scheme, reached),
        facts=[f for f in store.fact_rows(run_id) if _before(f, start, cutoff)],
        questions=_carried_questions(store.question_rows(run_id), new_id, scheme),
        deadline=runtime().settings.expiry.deadline("restart", store.now()),
        source=source,
        who=who,
        detail={"old_status": row["status"], "called_again": _called_again(effects, reached)},
    )
    store.write_restart(plan)
    args_cache = runtime().args_cache
    if run_id in args_cache:
        args_cache.setdefault(new_id, args_cache[run_id])
    return resume(
        new_id,
        store=store,
        allow_code_change=allow_code_change,
        args=args,
        kwargs=kwargs,
        source="restart",
    )


def _check_restartable(
    store: Store, run_id: str, row: dict[str, Any], allow_code_change: bool
) -> None:
    status = row["status"]
    superseded_error(run_id, store.children(run_id), "restart")
    if status not in ENDED and status not in SUPERSEDABLE:
        if runtime().live_handle(run_id) is not None:
            hint = "Stop it first (its handle's .stop()) and wait for it."
        else:
            hint = (
                f"If its process died, resume it with kx.resume({run_id!r}) or let it "
                "suspend first."
            )
        raise RunStateError(
            f"Run {run_id!r} is {status}; a running run cannot be restarted. " + hint
        )
    if row["agent"] != CELL_AGENT:  # %%agent cells: the notebook's cells are the code
        agent_for(run_id, row, allow_code_change, "restart")  # before the ledger changes
    effects = store.load_effects(run_id).values()
    for effect in effects:  # may have half-happened: decided like an unknown one, as on resume
        if effect["status"] == EffectStatus.FAILED and not effect["resumable"]:
            store.mark_failed_unknown(
                effect["key"],
                f"resumable=False call failed ({effect.get('error')}); may have happened",
            )
            effect["status"] = EffectStatus.UNKNOWN
    unknown = [e for e in effects if e["status"] in (EffectStatus.UNKNOWN, EffectStatus.PENDING)]
    if unknown:
        tools = ", ".join(sorted({str(e["tool"]) for e in unknown}))
        raise RunStateError(
            f"Run {run_id!r} has {len(unknown)} effect(s) whose outcome is unknown ({tools}). "
            f"Reconcile them first with kx.reconcile({run_id!r}) (mark each applied or not "
            f"applied), then call kx.restart({run_id!r}) again."
        )


def _start_ordinal(run_id: str, steps: list[dict[str, Any]], from_step: int | str | None) -> int:
    last = max((s["ordinal"] for s in steps), default=-1)
    if from_step is None:
        return int(last) + 1
    if isinstance(from_step, bool) or not isinstance(from_step, (int, str)):
        raise TypeError(
            f"from_step is a step ordinal (int) or a step key (str), not {from_step!r}."
        )
    if isinstance(from_step, int):
        if not 0 <= from_step <= last + 1:
            raise ValueError(
                f"Run {run_id!r} completed steps 0..{last}; from_step must be between 0 and "
                f"{last + 1} (the ordinal of the step to run again). "
                f"kx.restart({run_id!r}) alone continues after the last completed step."
            )
        return from_step
    for step in steps:
        if step["key"] == from_step:
            return int(step["ordinal"])
    keys = ", ".join(repr(s["key"]) for s in steps[-10:]) or "none"
    raise ValueError(
        f"Run {run_id!r} has no completed step with key {from_step!r} (last completed keys: "
        f"{keys}). Pass one of them, or a step ordinal."
    )


def _check_snapshots(run_id: str, carried: list[dict[str, Any]]) -> None:
    """Refused when a carried snapshot was removed (retention). A ``run.map`` item takes
    none (its stored result marks it), so a carried item needs no snapshot."""
    removed = [s["removed_at"] for s in carried if s["removed_at"] is not None]
    missing = [s for s in carried if s["snapshot_id"] is None and s.get("result") is None]
    if not removed and not missing:
        return
    if removed:
        reason = f"was removed on {moment_text(max(removed))} after its retention period "
        reason += "(kx.configure(retention_seconds=...))"
    else:
        reason = f"of step {missing[-1]['ordinal']} ({missing[-1]['key']!r}) is not in the store"
    raise RunStateError(
        f"A snapshot of run {run_id!r} {reason}, so it cannot be restarted from step "
        f"{carried[-1]['ordinal'] + 1}. Its run row and ledger remain for the audit "
        f"(kx.sql(\"select * from effects where run_id = '{run_id}'\")); "
        "start a new run instead, or restart with from_step=0."
    )


def _before(row: dict[str, Any], start: int, cutoff: dt.datetime | None) -> bool:
    ordinal = row.get("step_ordinal")
    if ordinal is not None:
        return int(ordinal) < start
    return cutoff is not None and row["recorded_at"] <= cutoff


def child_key(new_id: str, row: dict[str, Any], scheme: int) -> uuid.UUID:
    """The key the new run computes for the call recorded in ``row`` (the one place
    restart derives a key: through ``effect_key``), in the key scheme the new run's row
    records (the parent's: see ``RestartMixin.write_restart``), so that its calls find
    these rows."""
    return effect_key(new_id, row["step_key"], row["tool"], int(row["call_ordinal"]), scheme)


def _carried_effects(
    effects: list[dict[str, Any]], old_id: str, new_id: str, scheme: int, reached: set[str]
) -> list[dict[str, Any]]:
    """Every applied effect of the old run, keyed for the new run (see the module doc),
    and as ``unknown`` every ``given_up`` one and every ``failed`` one that may have
    reached its target (``reached``: their keys): nobody said whether it happened, so the
    new run stops at its take-over in ``needs_decision`` and a person decides it there
    (``kx.reconcile`` of the new run) instead of it being made again."""
    out: list[dict[str, Any]] = []
    for old in effects:
        note = f"carried over from run {old_id} (key {old['key']})"
        why = _unknown_why(old, old_id, reached)
        if why is not None:
            note = f"{why}; outcome unknown"
            out.append(
                {
                    **old,
                    "key": child_key(new_id, old, scheme),
                    "run_id": new_id,
                    "status": EffectStatus.UNKNOWN,
                    "outcome_at": None,
                    "decided_by": None,
                    "decision_note": note,
                }
            )
            continue
        if old["status"] != EffectStatus.APPLIED:
            continue
        if old.get("decision_note"):
            note += f"; {old['decision_note']}"
        out.append(
            {**old, "key": child_key(new_id, old, scheme), "run_id": new_id, "decision_note": note}
        )
    return out


def _unknown_why(old: dict[str, Any], old_id: str, reached: set[str]) -> str | None:
    """Why the old run's effect is carried as unknown, or None."""
    if old["status"] == EffectStatus.GIVEN_UP:
        return f"given up in run {old_id} (key {old['key']})"
    if old["status"] == EffectStatus.FAILED and str(old["key"]) in reached:
        return (
            f"failed in run {old_id} (key {old['key']}) after its request may have reached "
            "the target (an error answered after it left; the tool takes no idempotency_key)"
        )
    return None


def _carried_questions(
    rows: list[dict[str, Any]], new_id: str, scheme: int
) -> list[dict[str, Any]]:
    """The answered questions of the old run, keyed for the new run (``question_key``), so
    that a step that runs again gets the answer back instead of asking again."""
    return [
        {
            **row,
            "key": question_key(new_id, row["step"], int(row["call_ordinal"]), scheme),
            "run_id": new_id,
        }
        for row in rows
        if row["answered_at"] is not None
    ]


def _called_again(effects: list[dict[str, Any]], reached: set[str]) -> list[dict[str, Any]]:
    """The effects of the old run that did not happen, which the new run calls again."""
    return [
        {"key": str(e["key"]), "tool": e["tool"], "step": e["step_key"], "status": e["status"]}
        for e in effects
        if e["status"] != EffectStatus.APPLIED and _unknown_why(e, "", reached) is None
    ]


def _next_child_id(store: Store, run_id: str) -> str:
    taken = set(store.children(run_id))
    n = len(taken) + 1
    while f"{run_id}-restart{n}" in taken or store.find_run(f"{run_id}-restart{n}"):
        n += 1
    return f"{run_id}-restart{n}"
