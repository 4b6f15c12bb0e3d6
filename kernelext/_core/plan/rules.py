"""The rules of a resume plan: what blocks a resume or may stop it after the take-over
(:func:`judge`), and which changes between a previewed plan and a fresh one matter
(:func:`plan_differences`, which ``kx.resume(run_id, plan=p)`` refuses on).
"""

from __future__ import annotations

from ...status import TERMINAL
from ..facts.facts import CONTRADICTIONS
from .code import how_to_define
from .items import UNSEEN, PlanData

__all__ = ["judge", "plan_differences"]


def judge(result: PlanData, live: str | None) -> None:
    """Fill ``blockers`` (a resume would not get going now: it is refused, or stops for a
    person) and ``warnings`` (it may stop after taking the run over). ``live``: where the
    run executes (``here``, or its owner elsewhere), None when nobody executes it."""
    rid = result.run_id
    if result.status in TERMINAL:
        result.blockers.append(
            f"the run is {result.status}: it cannot be resumed; start a new run with the "
            f"agent's .start(...) and a new run_id, or kx.restart({rid!r})"
        )
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
            how = how_to_define(change.name)
            result.blockers.append(
                f"agent {change.name!r} is not defined in this process: "
                f"{how[:1].lower()}{how[1:]} first"
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
        shown = ", ".join(f"{e.tool} in {e.step_text}" for e in fresh[:5])
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
