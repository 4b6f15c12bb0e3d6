"""A gated effect call (``@kx.effect(needs_approval=...)``): one approved request, bound to
the call's key and arguments, consumed by the call's intent; a call approved with edits is
made with the edited arguments (``approval_extras``). Mixed into ``ledger.Effect``.

A call made inside another recorded call (an effect's body, a framework's tool call) asks
and waits the same way. Its approval is asked before anything of it is sent, so the
enclosing call is left before it returned with nothing of that inner call made: it is
recorded ``not_applied`` with why (:func:`left_inside`, ``LEFT_INSIDE``), never
``unknown``. The resume makes it again under its key: the calls it made before replay
from the ledger by their own keys, the approved inner call is made once, and the
enclosing call's own approval, consumed when it was first made, holds for it
(:meth:`EffectApproval._still_approved`). A question asked inside it (``run.ask``)
leaves it the same way until answered; a rejected inner call leaves it the same way,
and the rejection is raised again there on every replay, as at a top-level call.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

from ..._store.approvals import APPROVED
from ...errors import EffectRejected, LedgerError
from ...status import EffectStatus, Reason
from ..encoding.effect_args import CallArguments
from ..encoding.keys import load_result
from ..engine.run_engine import RunEngine
from ..people.approval_extras import apply_edit, edited_call, refuse_edit
from ..people.approvals import approval_for_call
from ..people.waiting import WaitingForPerson

__all__ = ["LEFT_INSIDE", "EffectApproval", "left_inside"]

# How the error of a call left for a call made inside it begins (``left_inside``).
LEFT_INSIDE = "left before it returned: "


def left_inside(exc: BaseException) -> str | None:
    """Why a recorded call's body was left without an outcome of its own, when ``exc`` is
    a call made inside it waiting for a person's approval or answer (``run.ask``: the
    run suspends) or rejected by one: that inner call was not made, so neither was the
    enclosing one (recorded ``not_applied``, made again on resume). ``None`` for anything
    else: a person's stop, a forced stop, an error keep their outcomes (``unknown``,
    ``failed``)."""
    if isinstance(exc, WaitingForPerson):
        waits = "approval" if exc.reason == Reason.APPROVAL else "an answer"
        return f"{LEFT_INSIDE}a call made inside it waits for {waits} ({exc.note})"
    if isinstance(exc, EffectRejected):
        note = f": {exc.note}" if exc.note else ""
        return f"{LEFT_INSIDE}{exc.tool} (key {exc.key}), called inside it, was rejected{note}"
    return None


# A gated call's arguments with every value of its data arguments, by effect key, while the
# call is prepared: what its approval request stores (``effects.args`` keeps a summary).
_SEEN: dict[uuid.UUID, tuple[str, dict[str, Any] | None]] = {}  # with the call by name
# A call approved with edits: the arguments it is made with, from its intent to the call.
_EDITED: dict[uuid.UUID, tuple[tuple[Any, ...], dict[str, Any]]] = {}


class EffectApproval(CallArguments):
    """The approval of an effect's calls (``needs_approval``: a bool, or a rule of them)."""

    needs_approval: bool | Callable[..., Any]

    # -- approval: one approved request, bound to key and arguments, per call ---------------
    def _gated(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        rule = self.needs_approval
        return bool(rule(*args, **kwargs)) if callable(rule) else rule

    def _record_intent(
        self, run: RunEngine, row: dict[str, Any], gated: bool
    ) -> dict[str, Any] | None:
        """Record the intent (durable before the call); a gated call first consumes its
        approval. Returns the ledger row when the call has an intent already."""
        if not gated:
            with run.force.critical():
                return run.store.write_intent(row)
        for _ in range(2):  # an approval that lapsed meanwhile: the second look asks again
            grant = self._approval(run, row)
            made = self._edited(run, row, grant)  # approved with edits: the edited call
            with run.force.critical():
                consumed, existing = run.store.write_intent_consuming_approval(made, grant)
            if consumed:
                row.update(args_hash=made["args_hash"], args=made["args"])
            else:
                _EDITED.pop(row["key"], None)
            if existing is not None or consumed:
                return existing
        raise LedgerError(f"The approval of {self.tool} (key {row['key']}) could not be used.")

    def _approval(self, run: RunEngine, row: dict[str, Any]) -> Any:
        """The id of the approved request for this call; else the run suspends for one
        (``approvals.approval_for_call``)."""
        seen = _SEEN.get(row["key"])
        return approval_for_call(run, self.tool, {**row, "args": seen[0] if seen else row["args"]})

    def _still_approved(self, run: RunEngine, row: dict[str, Any]) -> bool:
        """Whether a gated call made again is made under the approval it consumed first:
        only a call left for a call made inside it (``left_inside``), which never returned,
        and only with that approval's edits (kept for the call, ``_made_with``)."""
        left = str(row.get("error") or "").startswith(LEFT_INSIDE)
        if row["status"] != EffectStatus.NOT_APPLIED or not left or row.get("decided_by"):
            return False
        request = run.store.approval(row["key"])  # the newest request of this call
        if request is None or request["decision"] != APPROVED or request["consumed_at"] is None:
            return False
        if self._edited(run, row, request["id"])["args_hash"] == row["args_hash"]:
            return True
        _EDITED.pop(row["key"], None)
        return False

    # -- approved with edits (``approval_extras``) -----------------------------------------
    editable = True  # calls made from their bound arguments (an MCP tool's are not)

    def _edited(self, run: RunEngine, row: dict[str, Any], grant: Any) -> dict[str, Any]:
        """The intent of the call approval ``grant`` allows: ``row``, or with edits the
        edited call (its arguments kept for the call, ``_made_with``)."""
        request = run.store.approval(grant)
        if request is None or request["edit"] is None:
            return row
        bound = (_SEEN.get(row["key"]) or ("", None))[1]
        if bound is None or self.signature is None or not self.editable:
            raise refuse_edit(self.tool, grant)
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        params = self.signature.parameters
        if any(params[n].kind in variadic for n in load_result(request["edit"]) if n in params):
            raise refuse_edit(self.tool, grant, variadic=True)
        edited = apply_edit(bound, request["edit"])
        args, kwargs, digest, shown = edited_call(self.signature, self.tool, edited)
        _EDITED[row["key"]] = (args, kwargs)
        return {**row, "args_hash": digest, "args": shown}

    def _expected(
        self, run: RunEngine, key: uuid.UUID, row: dict[str, Any], digest: str, gated: bool
    ) -> str:
        """The hash a recorded call is compared with: the edited call's when this call
        (``digest``) was approved with edits and made as such (here, or in the run a
        restart carried it from)."""
        if not gated or row["args_hash"] == digest:
            return digest
        recorded = str(row["args_hash"])
        return recorded if run.store.approved_edit(self.tool, digest, recorded) else digest

    @staticmethod
    def _made_with(
        key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments the call is made with: a person's edits, if approved with them."""
        return _EDITED.pop(key, (args, kwargs))
