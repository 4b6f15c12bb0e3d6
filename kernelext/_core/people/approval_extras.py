"""What an approval records beyond yes: data nobody saw, and edits of the call.

**Unseen data**: a request whose data arguments were too large to store whole
(``data_args.CELL_LIMIT``) is approved only with ``unseen=True``; its event records
``unseen_data`` (each such argument's row count). A plain approve is refused saying so.

**Edits**: a person changes some of a call's arguments (a lower amount).

``approve(edit={"amount": 100})`` (``kernelext approve ID --edit amount=100``) records, with
the decision, the edited values (``approvals.edit``, stored as results are, so the call gets
them back as the values they were) and the edited call as shown (``approvals.edited_args``);
the request keeps the original call (``args``, ``args_hash``) and the decision's event both.
When the run goes on, the call matches the request by its original hash, is made with the
edited arguments, and its intent records the edited call's hash, which the request records
too when the call uses it (``edited_args_hash``): what was approved is what is made. A later
replay of the original call finds the edited call it became.

Only arguments the request shows by name can be edited, not a redacted one, and a value must
be one that is stored faithfully (numbers, text, dates, decimals, lists, dicts, ...): a data
argument is not edited here (reject the call and let the agent pass other data). An effect
whose calls are not made from their bound arguments (an MCP tool, a model request) refuses
an edit at the call, and nothing is sent.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections import OrderedDict
from typing import Any

from ..._store import Store
from ..._store.approvals import APPROVED
from ...errors import LedgerError
from ..encoding import data_args
from ..encoding.canonical import Unencodable
from ..encoding.keys import bound_hash, display_args, load_result, redact, stored_result
from ..encoding.secrets import is_secret_name

__all__ = [
    "apply_edit",
    "check_edit",
    "decision_extras",
    "edit_columns",
    "edited_call",
    "refuse_edit",
]


def decision_extras(
    store: Store, ident: uuid.UUID, decision: str, unseen: bool, edit: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(event detail, edit columns)`` of approving request ``ident``: refuses a plain
    approve of data nobody saw, and an edit that cannot be made (nothing is decided then)."""
    if decision != APPROVED:
        if edit is not None:
            raise LedgerError("A rejection takes no edit: the call is not made at all.")
        return None, None
    row = store.approval(ident)
    if row is None or row["decision"] is not None or row["consumed_at"] is not None:
        return None, None  # the decision says why it is refused
    detail: dict[str, Any] = {}
    blind = data_args.unseen_data(json.loads(row["args"]) if row["args"] else {})
    if blind and not unseen:
        what = f"Approval {row['id']} ({row['tool']} in run {row['run_id']!r})"
        raise LedgerError(data_args.unseen_refusal(what, blind, row["id"]))
    if blind:
        detail["unseen_data"] = {data.name: data.row_count for data in blind}
    columns = edit_columns(row, edit) if edit is not None else None
    if edit is not None:
        detail.update(edit_event(row, edit))
    return detail or None, columns


def check_edit(where: str, value: object) -> dict[str, Any] | None:
    """``edit=``: None, or a non-empty dict of argument names to new values."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value or not all(isinstance(k, str) for k in value):
        raise TypeError(
            f"{where}: pass a dict of argument names to their new values, e.g. "
            f"edit={{'amount': 100}}, not {type(value).__name__} {value!r:.80}"
        )
    return dict(value)


def edit_columns(row: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    """The columns an approval with ``edit`` records on request ``row``; a name the request
    does not show, a redacted argument or a value that cannot be stored is refused."""
    shown = json.loads(row["args"]) if row["args"] else {}
    what = f"Approval {row['id']} ({row['tool']} in run {row['run_id']!r})"
    for name, value in edit.items():
        if name not in shown:
            raise LedgerError(
                f"{what}: it has no argument {name!r} to edit; its arguments are "
                f"{', '.join(sorted(shown)) or 'none'}. Nothing was decided."
            )
        if is_secret_name(name):
            raise LedgerError(
                f"{what}: argument {name!r} is shown redacted and cannot be edited. "
                "Nothing was decided."
            )
        try:
            stored = stored_result(value)
        except Unencodable as exc:
            raise LedgerError(
                f"{what}: the new value of {name!r} cannot be stored faithfully ({exc.why}). "
                "Edit plain values (numbers, text, dates, decimals, lists, dicts); to send "
                "other data, reject the call and let the agent make another. Nothing was decided."
            ) from None
        if load_result(stored) != value:
            raise LedgerError(
                f"{what}: the new value of {name!r} would not come back as it is "
                f"({type(value).__name__}). Nothing was decided."
            )
    edited = {**shown, **{name: redact(value, name, full=True) for name, value in edit.items()}}
    return {"edit": stored_result(edit), "edited_args": json.dumps(edited)}


def edit_event(row: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    """What the decision's event records of an edit: each argument from and to."""
    shown = json.loads(row["args"]) if row["args"] else {}
    return {
        "edit": {
            name: {"from": shown.get(name), "to": redact(value, name, full=True)}
            for name, value in edit.items()
        }
    }


def apply_edit(bound: dict[str, Any], edit_text: str) -> dict[str, Any]:
    """The call's arguments by name with the person's edits in place."""
    edit = load_result(edit_text)
    return {**bound, **{name: edit[name] for name in edit}}


def edited_call(
    signature: inspect.Signature, tool: str, edited: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], str, str]:
    """``(args, kwargs, hash, shown)`` of the edited call: made, hashed and shown by name,
    as the original was bound."""
    bound = inspect.BoundArguments(signature, OrderedDict(edited))
    return bound.args, bound.kwargs, bound_hash(edited, tool=tool), display_args(edited, tool=tool)


def refuse_edit(
    tool: str, approval_id: Any, *, again: bool = False, variadic: bool = False
) -> LedgerError:
    """An approval with edits of a call that cannot be made with them; nothing is sent."""
    why = (
        "a call made again under its key (after it failed or was not applied) is made as it "
        "was recorded"
        if again
        else "an edit names a variable argument (*args or **kwargs), whose parts are not "
        "arguments of their own (one could stand for another argument, or for the ledger's "
        "idempotency key)"
        if variadic
        else f"{tool}'s calls are sent as the agent made them (an MCP tool or a model request)"
    )
    return LedgerError(
        f"Approval {approval_id} of {tool} was given with edited arguments, but {why}, so it "
        "cannot be made with the edits; nothing was sent. kx.restart starts a new run that "
        "asks again; approve that one without edits."
    )
