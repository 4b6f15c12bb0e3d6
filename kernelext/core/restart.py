"""``kx.restart(run_id, from_step=None)``: a new run forked from a kept snapshot.

The new run (new id, ``parent_id`` = the old run) starts from the state after the
steps it carries over:

* ``from_step=None``: after the last completed step (nothing is repeated);
* ``from_step=N`` (an int): at step ordinal ``N`` (0-based, as in the ``steps``
  table): steps ``0 .. N-1`` are carried over, the state is the one after step
  ``N-1``, and step ``N`` runs again;
* ``from_step="key"`` (a str): at the completed step with that key (it runs again).

Carried steps become completed steps of the new run; their applied effects are
copied into the new run's ledger under the new run's keys, so they are replayed,
never repeated. Applied effects made outside any step before the restart point are
carried too. Facts recorded before that point are copied and revalidated by the
ordinary resume path, which the new run goes through. Claims the old run held are
taken again by the new run.

Refused when the old run has effects with an unknown outcome (reconcile first),
when it is still executing, or when the needed snapshot was removed after the
retention period. A run that is ``suspended`` or ``needs_decision`` is superseded:
it is cancelled (claims released) in the same transaction that creates the new run.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..errors import RunStateError
from ..status import EffectStatus
from ..store import Store, actor
from ..store.restart import ENDED, SUPERSEDABLE, RestartPlan
from ..validate import (
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
from .control import resume
from .handle import Handle
from .ledger import effect_key
from .resume import agent_for
from .run import OUTSIDE_STEPS
from .runtime import get_store, runtime

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
    store = get_store(store)
    row = store.get_run(run_id)
    _check_restartable(store, run_id, row, allow_code_change)
    steps = store.restart_steps(run_id)
    start = _start_ordinal(run_id, steps, from_step)
    carried = [s for s in steps if s["ordinal"] < start]
    _check_snapshots(run_id, carried)
    cutoff: dt.datetime | None = max((s["ended_at"] for s in carried), default=None)
    new_id = new_run_id or _next_child_id(store, run_id)
    if not isinstance(new_id, str) or not new_id.strip():
        raise ValueError(f"new_run_id must be a non-empty string, not {new_id!r}.")
    who = actor()
    plan = RestartPlan(
        old_id=run_id,
        new_id=new_id,
        start_ordinal=start,
        steps=carried,
        effects=_carried_effects(store, run_id, new_id, carried, cutoff),
        facts=[f for f in store.fact_rows(run_id) if _before(f, start, cutoff)],
        deadline=runtime().settings.expiry.deadline("restart", store.now()),
        source=source,
        who=who,
        detail={"old_status": row["status"]},
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
    unknown = [
        e
        for e in store.load_effects(run_id).values()
        if e["status"] in (EffectStatus.UNKNOWN, EffectStatus.PENDING)
    ]
    if unknown:
        tools = ", ".join(sorted({str(e["tool"]) for e in unknown}))
        raise RunStateError(
            f"Run {run_id!r} has {len(unknown)} effect(s) whose outcome is unknown ({tools}). "
            f"Reconcile them first with kx.reconcile({run_id!r}) (mark each applied or not "
            f"applied), then call kx.restart({run_id!r}) again."
        )
    agent_for(run_id, row, allow_code_change, "restart")


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
    if not carried:
        return
    last = carried[-1]
    removed = [s["removed_at"] for s in carried if s["removed_at"] is not None]
    if removed or last["snapshot_id"] is None:
        when = f" on {max(removed):%Y-%m-%d %H:%M} UTC" if removed else ""
        raise RunStateError(
            f"The snapshot of run {run_id!r} was removed{when} after its retention period "
            f"(kx.configure(retention_seconds=...)), so it cannot be restarted from step "
            f"{last['ordinal'] + 1}. Its run row and ledger remain for the audit "
            f"(kx.sql(\"select * from effects where run_id = '{run_id}'\")); "
            "start a new run instead, or restart with from_step=0."
        )


def _before(row: dict[str, Any], start: int, cutoff: dt.datetime | None) -> bool:
    ordinal = row.get("step_ordinal")
    if ordinal is not None:
        return int(ordinal) < start
    return cutoff is not None and row["recorded_at"] <= cutoff


def _carried_effects(
    store: Store,
    old_id: str,
    new_id: str,
    carried: list[dict[str, Any]],
    cutoff: dt.datetime | None,
) -> list[dict[str, Any]]:
    keys = {s["key"]: s["ordinal"] for s in carried}
    out: list[dict[str, Any]] = []
    for old in store.load_effects(old_id).values():
        if old["status"] != EffectStatus.APPLIED:
            continue
        in_step = old["step_key"] in keys and old["step_ordinal"] == keys[old["step_key"]]
        outside = (
            old["step_key"] == OUTSIDE_STEPS and cutoff is not None and old["intent_at"] <= cutoff
        )
        if not (in_step or outside):
            continue
        note = f"carried over from run {old_id} (key {old['key']})"
        if old.get("decision_note"):
            note += f"; {old['decision_note']}"
        out.append(
            {
                **old,
                "key": effect_key(new_id, old["step_key"], old["tool"], int(old["call_ordinal"])),
                "run_id": new_id,
                "decision_note": note,
            }
        )
    return out


def _next_child_id(store: Store, run_id: str) -> str:
    taken = set(store.children(run_id))
    n = len(taken) + 1
    while f"{run_id}-restart{n}" in taken or store.find_run(f"{run_id}-restart{n}"):
        n += 1
    return f"{run_id}-restart{n}"
