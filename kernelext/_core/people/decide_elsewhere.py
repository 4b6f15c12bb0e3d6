"""A person's Approve or Reject that reaches the store without the kernel's help.

The panel's approval card sends Approve and Reject through the notebook server as it sends
Stop (``from_elsewhere``): the decision is recorded at once, through the same door as
``kx.approve`` and ``kernelext approve`` (``approvals.decide_request``: exactly one
decision wins, bound to the request's id), with the Jupyter user as who decided. The run
goes on where it waits: the card then asks its kernel to resume the run, which happens as
soon as that kernel is free (``control.resume_if_here``); a run another process executes
goes on at its next ``kx.resume``.

A question's card answers the same way (:func:`answer`): the answer is checked against the
question's schema and stored through the door of ``kx.answer`` and ``kernelext answer``
(``Question.record``: exactly one answer wins; a later one is refused, saying who answered
and when), then the card asks its kernel to resume the run.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..._store import Store, actor
from ..._store.approvals import APPROVED, REJECTED
from .approvals import decide_request
from .asking import encode_answer, parse_answer
from .questions import Question

__all__ = ["DECISIONS", "MAX_NOTE", "answer", "decide"]

DECISIONS = {"approve": APPROVED, "reject": REJECTED}
MAX_NOTE = 2000  # characters of a note for the record


def _note(note: object) -> str | None:
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise ValueError(f"A note is text of at most {MAX_NOTE} characters.")
    return (note or "").strip() or None


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
    note = _note(note)
    if not any(row["id"] == ident for row in store.approval_rows(run_id=run_id)):
        raise ValueError(f"Run {run_id} has no approval request {request}: nothing was decided.")
    decision = DECISIONS[action]
    row = decide_request(
        store,
        ident,
        decision,
        who=who or actor(),
        note=note,
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


def answer(
    store: Store,
    run_id: str,
    key: object,
    value: Any,
    *,
    typed: bool = False,
    note: object = None,
    who: str | None = None,
    source: str = "panel",
) -> dict[str, Any]:
    """Answer question ``key`` of run ``run_id`` with ``value`` (``typed``: text, read as the
    question's schema asks, as ``kernelext answer`` reads it); say what happened.

    Nothing is stored when the question belongs to another run, does not fit the schema,
    was answered already (one answer wins) or expired."""
    if not isinstance(key, str):
        raise ValueError('An answer needs the key of its question ("key": "<uuid>").')
    try:
        ident = uuid.UUID(key)
    except ValueError:
        raise ValueError(f"{key!r} is not the key of a question.") from None
    note = _note(note)
    row = store.question_row(ident)
    if row is None or row["run_id"] != run_id:
        raise ValueError(f"Run {run_id} has no question {key}: nothing was answered.")
    question = Question(store, row)
    if typed:
        if not isinstance(value, str):
            raise ValueError('A typed answer is text ("answer": "<what was typed>").')
        value = parse_answer(question.schema, value)
    question.check(value)
    question.record(encode_answer(value), who=who or actor(), note=note, source=source)
    return {
        "answered": True,
        "who": question.row.get("actor"),
        "message": (
            f"Answered by {question.row.get('actor')}: {question.prompt!r}; the run goes on "
            "as soon as its kernel is free."
        ),
    }
