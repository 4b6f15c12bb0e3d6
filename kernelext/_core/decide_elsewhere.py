"""A person's Approve or Reject that reaches the store without the kernel's help.

The panel's approval card sends Approve and Reject through the notebook server as it sends
Stop (``from_elsewhere``): the decision is recorded at once, through the same door as
``kx.approve`` and ``kernelext approve`` (``approvals.decide_request``: exactly one
decision wins, bound to the request's id), with the Jupyter user as who decided. The run
goes on where it waits: the card then asks its kernel to resume the run, which happens as
soon as that kernel is free (``control.resume_if_here``); a run another process executes
goes on at its next ``kx.resume``.
"""

from __future__ import annotations

import uuid
from typing import Any

from .._store import Store, actor
from .._store.approvals import APPROVED, REJECTED
from .approvals import decide_request

__all__ = ["DECISIONS", "MAX_NOTE", "decide"]

DECISIONS = {"approve": APPROVED, "reject": REJECTED}
MAX_NOTE = 2000  # characters of a note for the record


def decide(
    store: Store,
    action: str,
    run_id: str,
    request: object,
    *,
    note: object = None,
    who: str | None = None,
    source: str = "panel",
) -> dict[str, Any]:
    """Approve or reject approval request ``request`` of run ``run_id``; say what happened.

    A request of another run is refused before anything is written (a click names both)."""
    if not isinstance(request, str):
        raise ValueError('An approval needs the id of its request ("request": "<uuid>").')
    try:
        ident = uuid.UUID(request)
    except ValueError:
        raise ValueError(f"{request!r} is not the id of an approval request.") from None
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise ValueError(f"A note is text of at most {MAX_NOTE} characters.")
    if not any(row["id"] == ident for row in store.approval_rows(run_id=run_id)):
        raise ValueError(f"Run {run_id} has no approval request {request}: nothing was decided.")
    decision = DECISIONS[action]
    row = decide_request(
        store,
        ident,
        decision,
        who=who or actor(),
        note=(note or "").strip() or None,
        source=source,
    )
    return {
        "decision": decision,
        "who": row.get("actor"),
        "message": (
            f"{decision.capitalize()} by {row.get('actor')}: {row['tool']} "
            + (
                "may be made once, with these arguments; the run goes on as soon as its "
                "kernel is free."
                if decision == APPROVED
                else "is refused; the agent gets kx.EffectRejected at that call."
            )
        ),
    }
