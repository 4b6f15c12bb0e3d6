"""Revalidating a run before it continues, and the three ways out of a contradiction.

On every resume, once the run has been taken over and before the first action
(``resume_steps.py``):

1. refreshes every credential recorded by the completed steps (a failure stops the
   resume; the run stays ``suspended``);
2. re-checks every value fact recorded by the completed steps (or outside any step),
   each within the ``check_timeout`` setting (seconds);
3. on any contradiction, stops the resume in ``needs_decision``. The side-by-side
   details are in the ``facts`` table and in ``kx.revalidation(run_id)``.

Order with unknown effects: a run that is also waiting on effects with an unknown
outcome stops for those *first* (the ledger is consulted before any hook runs).
Decide them with ``kx.reconcile(run_id)``, then ``kx.resume(run_id)``: the facts
are re-checked then and any contradiction is decided here.

The three decisions, each one event (``revalidation_decision``) with who, when and
the note: ``accept`` (re-checked values become the recorded facts; the run
resumes), ``replan(from_step)`` (the run resumes from the snapshot taken before
that step; later steps run again, and their effects already applied are replayed
from the ledger, not repeated), ``abort`` (the run is cancelled, claims released).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..._formatting import duration_text, step_label
from ..._shown import shows
from ..._store import Store, actor
from ..._validate import NOTE, RUN_ID, SOURCE, STORE, check_step, validated
from ...errors import RunStateError
from ...status import Status
from ..encoding.codec import loads_json
from ..facts import credentials
from ..facts.facts import CONTRADICTIONS
from ..process.runtime import get_store, runtime
from .control import resume
from .handle import Handle

__all__ = ["FactCheck", "Revalidation", "revalidation"]

DECISION_EVENT = "revalidation_decision"


# -- the side-by-side view ----------------------------------------------------------------------
class FactCheck:
    """One recorded fact with the outcome of its last re-check."""

    def __init__(self, row: dict[str, Any], step_key: str | None, now: dt.datetime) -> None:
        self.row = row
        self.name: str = row["name"]
        self.kind: str = row["kind"]
        self.recorded: Any = _decode(row["value"])
        self.current: Any = _decode(row["current_value"])
        self.recorded_at: dt.datetime = row["recorded_at"]
        self.checked_at: dt.datetime | None = row["checked_at"]
        self.status: str = row["check_status"] or "unchecked"
        self.detail: str = row["check_detail"] or ""
        self.step_ordinal: int | None = row["step_ordinal"]
        self.step_key = step_key
        self.check_name: str | None = row["check_name"]
        self.fingerprint: str | None = row["fingerprint"]
        self.age: dt.timedelta = now - self.recorded_at

    @property
    def contradicted(self) -> bool:
        return self.kind == "value" and self.status in CONTRADICTIONS

    @shows
    def __repr__(self) -> str:
        return (
            f"<fact {self.name} recorded={_show(self)} current={_show(self, True)} {self.status}>"
        )


class Revalidation:
    """The facts of a run side by side (recorded, current, age, status), and the decisions."""

    def __init__(self, run_id: str, store: Store) -> None:
        self.run_id = run_id
        self.store = store
        self.decision: str | None = None
        self.handle: Handle | None = None
        self.reload()

    def reload(self) -> None:
        """Read the run, its facts, completed steps and open unknowns again."""
        row = self.store.get_run(self.run_id)
        self.status: str = row["status"]
        self.reason: str | None = row["reason"]
        now = self.store.now()
        self.steps = [
            {"ordinal": s["ordinal"], "key": s["key"], "name": s["name"]}
            for s in self.store.completed_steps(self.run_id)
        ]
        keys = {s["ordinal"]: s["key"] for s in self.steps}
        self.facts = [
            FactCheck(r, keys.get(r["step_ordinal"]), now) for r in self.store.facts(self.run_id)
        ]
        self.unknown_effects = self.store.open_unknowns(self.run_id)

    @property
    def contradictions(self) -> list[FactCheck]:
        return [fact for fact in self.facts if fact.contradicted]

    def step_ordinal(self, from_step: int | str) -> int:
        """The ordinal of a completed step given by ordinal or key."""
        for step in self.steps:
            if from_step in (step["ordinal"], step["key"]) and not isinstance(from_step, bool):
                return int(step["ordinal"])
        choices = ", ".join(f"{s['ordinal']} ({s['key']!r})" for s in self.steps) or "none"
        raise ValueError(
            f"Run {self.run_id!r} has no completed step {from_step!r} to re-plan from. "
            f"Completed steps (ordinal and key): {choices}."
        )

    def replayed_effects(self, from_step: int | str) -> list[dict[str, Any]]:
        """Effects recorded at or after ``from_step``: on re-plan they are not performed
        again; a replayed step gets their recorded result (same key, same arguments)."""
        return self.store.effects_from_step(self.run_id, self.step_ordinal(from_step))

    # -- the three decisions -------------------------------------------------------------
    @validated("Revalidation.accept", note=NOTE, source=SOURCE)
    def accept(
        self, note: str | None = None, *, source: str = "api", **resume_options: Any
    ) -> Handle:
        """Accept the world as it is now: re-checked values become the recorded facts and
        the run resumes (facts are not re-checked again for this resume). Returns the
        new handle. Extra keyword arguments go to ``kx.resume``."""
        facts = self._decidable()
        names = [f.name for f in facts]
        detail = {"decision": "accept", "facts": [_fact_detail(f) for f in facts]}
        return self._decide(names, detail, note, source, resume_options)

    @validated("Revalidation.replan", from_step=check_step, note=NOTE, source=SOURCE)
    def replan(
        self,
        from_step: int | str,
        note: str | None = None,
        *,
        source: str = "api",
        **resume_options: Any,
    ) -> Handle:
        """Resume from the snapshot taken before ``from_step`` (a completed step's ordinal
        or key): that step and every later one run again. Their effects already applied
        are not repeated: the ledger rows stand and the replayed calls get the recorded
        results (a replayed call with different arguments stops with
        EffectArgumentsMismatch). Contradicted facts of the kept steps are accepted.
        Returns the new handle; see ``replayed_effects(from_step)`` beforehand."""
        facts = self._decidable()
        ordinal = self.step_ordinal(from_step)
        key = next(s["key"] for s in self.steps if s["ordinal"] == ordinal)
        kept = [f for f in facts if f.step_ordinal is None or f.step_ordinal < ordinal]
        replayed = self.store.effects_from_step(self.run_id, ordinal)
        detail = {
            "decision": "replan",
            "from_step": ordinal,
            "step_key": key,
            "facts": [_fact_detail(f) for f in facts],
            "accepted": [f.name for f in kept],
            "replayed_effects": [
                {
                    "key": str(e["key"]),
                    "tool": e["tool"],
                    "step": e["step_key"],
                    "status": e["status"],
                }
                for e in replayed
            ],
        }

        accepted = [f.name for f in kept]
        return self._decide(accepted, detail, note, source, resume_options, supersede=ordinal)

    def _decide(
        self,
        accepted: list[str],
        detail: dict[str, Any],
        note: str | None,
        source: str,
        resume_options: dict[str, Any],
        *,
        supersede: int | None = None,
    ) -> Handle:
        """Record an accept or re-plan decision in one transaction, then resume."""

        def job(tx: Any) -> None:
            self.store.lock_for_decision_tx(tx, self.run_id)
            self.store.accept_facts_tx(tx, self.run_id, accepted)
            if supersede is not None:
                detail["superseded_steps"] = self.store.supersede_steps_tx(
                    tx, self.run_id, supersede
                )
            self.store.event(
                tx,
                self.run_id,
                DECISION_EVENT,
                source=source,
                who=actor(),
                reason=note,
                detail=detail,
            )

        self.store.write(job)
        self.decision = str(detail["decision"])
        return self._resume(source, resume_options)

    @validated("Revalidation.abort", note=NOTE, source=SOURCE)
    def abort(self, note: str | None = None, *, source: str = "api") -> None:
        """Cancel the run (terminal); its claims are released and its records kept."""
        self.reload()
        detail = {"decision": "abort", "facts": [_fact_detail(f) for f in self.contradictions]}
        who = actor()

        def job(tx: Any) -> None:
            self.store.lock_for_decision_tx(tx, self.run_id)
            self.store.event(
                tx, self.run_id, DECISION_EVENT, source=source, who=who, reason=note, detail=detail
            )
            self.store.transition_tx(
                tx,
                self.run_id,
                Status.CANCELLED,
                (Status.NEEDS_DECISION,),
                kind=Status.CANCELLED,
                source=source,
                who=who,
                reason=note or "aborted at revalidation",
            )
            self.store.release_run_claims_tx(tx, self.run_id, Status.CANCELLED)

        self.store.write(job)
        credentials.forget(self.run_id)
        self.decision = "abort"
        self.reload()

    def _decidable(self) -> list[FactCheck]:
        self.reload()
        if self.status != Status.NEEDS_DECISION:
            raise RunStateError(
                f"Run {self.run_id!r} is {self.status}, not needs_decision: there is nothing to "
                f"decide. Resume it with kx.resume({self.run_id!r})."
            )
        if self.unknown_effects:
            raise RunStateError(
                f"Run {self.run_id!r} first waits on {len(self.unknown_effects)} effect(s) "
                f"with an unknown outcome. Decide those with kx.reconcile({self.run_id!r}), "
                f"then kx.resume({self.run_id!r}); its facts are re-checked at that resume."
            )
        facts = self.contradictions
        if not facts:
            raise RunStateError(
                f"Run {self.run_id!r} has no contradicted fact to decide (it waits for: "
                f"{self.reason}). Resume it with kx.resume({self.run_id!r}) to re-check."
            )
        return facts

    def _resume(self, source: str, options: dict[str, Any]) -> Handle:
        # The person just decided about the facts: they are not re-checked at this resume.
        self.handle = resume(
            self.run_id, store=self.store, source=source, recheck_facts=False, **options
        )
        self.reload()
        return self.handle

    # -- display ------------------------------------------------------------------------
    @shows
    def text(self) -> str:
        bad = self.contradictions
        lines = [
            f"Run {self.run_id}: {self.status}; {len(bad)} of {len(self.facts)} fact(s) "
            "contradicted"
        ]
        if self.unknown_effects:
            lines.append(
                f"  First decide {len(self.unknown_effects)} effect(s) with an unknown "
                f"outcome: kx.reconcile({self.run_id!r}); facts are re-checked at "
                "the next resume."
            )
        for fact in self.facts:
            outside = fact.step_key is None and fact.step_ordinal is None
            step = "outside steps" if outside else step_label(fact.step_ordinal, fact.step_key)
            lines.append(
                f"  {fact.name}: recorded {_show(fact)}, current {_show(fact, True)}, "
                f"age {duration_text(fact.age)}, {fact.status}"
                + (f" ({fact.detail})" if fact.detail else "")
                + f", {step}"
            )
        if self.decision:
            lines.append(f"Decided: {self.decision}.")
        elif bad and self.status == Status.NEEDS_DECISION:
            lines.append(
                "Decide: .accept(note=...), .replan(from_step, note=...), .abort(note=...)"
            )
        return "\n".join(lines)

    @shows
    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = runtime().settings.revalidation_renderer
        if renderer is None:
            return {"text/plain": self.text()}
        return renderer(self)


@validated("kx.revalidation", run_id=RUN_ID, store=STORE)
def revalidation(run_id: str, *, store: Store | None = None) -> Revalidation:
    """The facts of ``run_id`` side by side, with ``accept`` / ``replan`` / ``abort``."""
    return Revalidation(run_id, get_store(store))


def _decode(text: str | None) -> Any:
    return loads_json(text) if text is not None else None


def _show(fact: FactCheck, current: bool = False) -> str:
    if fact.kind == "credential":
        return "(credential, not stored)" if not current else (fact.fingerprint or "-")
    if current and fact.row["current_value"] is None:
        return "-"
    value = fact.current if current else fact.recorded
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fact_detail(fact: FactCheck) -> dict[str, Any]:
    return {
        "name": fact.name,
        "recorded": fact.row["value"],
        "current": fact.row["current_value"],
        "status": fact.status,
        "recorded_at": fact.recorded_at.isoformat(),
        "checked_at": fact.checked_at.isoformat() if fact.checked_at else None,
    }
