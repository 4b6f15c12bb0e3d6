"""What a resume does before the run's first action, in this order.

1. ``refresh_credentials``: every credential the run used is refreshed (a credential that
   cannot be refreshed suspends the run, reason ``error``).
2. ``recheck_facts``: the facts the kept steps depended on are checked again; one that no
   longer holds moves the run to ``needs_decision`` (``kx.revalidation`` decides). Skipped
   when the resume follows that decision.

Effects left ``pending`` became ``unknown`` in the take-over (``takeover.py``) before these
steps; approvals are consumed by the effect call itself when the agent reaches it again
(``ledger/effect.py``), so a resume never sends anything on its own.
"""

from __future__ import annotations

from ..._store import Store
from ...errors import NeedsDecision
from ...status import Reason, Status
from ..engine.run_engine import RunEngine
from ..facts import credentials
from ..facts.facts import CONTRADICTIONS, recheck
from ..process.runtime import runtime

__all__ = ["before_first_action", "recheck_facts", "refresh_credentials"]


def before_first_action(run: RunEngine, store: Store, *, recheck: bool = True) -> bool:
    """Run the resume steps (module docstring). Returns False when the run now waits in
    ``needs_decision``. A step that fails suspends the run again (reason ``error``) and its
    error propagates: a resume never half-happens."""
    try:
        refresh_credentials(run, store)
        if recheck:
            recheck_facts(run, store)
    except NeedsDecision as decision:
        store.transition(
            run.id,
            Status.NEEDS_DECISION,
            (Status.RUNNING,),
            kind=Status.NEEDS_DECISION,
            source="revalidation",
            reason=str(decision),
            epoch=store.held_epoch(run.id),  # taken over meanwhile: OwnershipLost
        )
        return False
    except BaseException as exc:
        store.transition(
            run.id,
            Status.SUSPENDED,
            (Status.RUNNING,),
            kind="resume_failed",
            source="revalidation",
            reason=f"resume stopped: {exc}",
            fields={"reason": Reason.ERROR},
            epoch=store.held_epoch(run.id),  # taken over meanwhile: OwnershipLost
        )
        raise
    return True


def _kept_facts(run: RunEngine, store: Store, kind: str) -> list[dict[str, object]]:
    kept = set(run.completed.values())
    return [
        r
        for r in store.facts(run.id)
        if r["kind"] == kind and (r["step_ordinal"] is None or r["step_ordinal"] in kept)
    ]


def refresh_credentials(run: RunEngine, store: Store) -> None:
    """Refresh every credential the kept steps used (``kx.credentials``)."""
    rows = _kept_facts(run, store, "credential")
    credentials.refresh_all(run, store, rows, runtime().settings.check_timeout)


def recheck_facts(run: RunEngine, store: Store) -> None:
    """Check the kept steps' facts again; raise ``NeedsDecision`` on a contradiction."""
    values = _kept_facts(run, store, "value")
    if not values:
        return
    results = recheck(run, store, values, runtime().settings.check_timeout)
    bad = [r for r in results if r["status"] in CONTRADICTIONS]
    if bad:
        shown = "; ".join(f"{r['name']} {r['status']}" for r in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise NeedsDecision(
            f"{len(bad)} of {len(results)} fact(s) no longer hold ({shown}{more}). Decide with "
            f"kx.revalidation({run.id!r}): .accept(), .replan(from_step) or .abort()."
        )
