"""The door for hot-path records (journal frames and the direct path alike).

Every record (``step_begin``, ``intent``, ``outcome``, ...) passes :func:`scrub_record`
before it is journaled or applied. Each field is scrubbed as the column it lands in
(:data:`_RECORD_FIELDS`, read in :data:`kernelext._store.columns.SCRUBBED`); a field the
table does not declare as text (an id, a timestamp, a count) passes untouched only when it
is of a type that holds no text (``columns._INERT``: None, flags, numbers, ids,
timestamps); anything else in it (text, bytes, lists, dicts, an ``Enum`` member, any other
object) goes through the same allow-list as a column's values (``columns._clean``): the
journal's encoder never writes a value the door did not look at.
"""

from __future__ import annotations

from typing import Any

from . import columns
from .columns import _INERT, _REFUSING, _T, SCRUBBED, _check, _clean

__all__ = ["scrub_record"]

_RECORD_FIELDS: dict[str, dict[str, tuple[str, str] | None]] = {
    "step_begin": {"run_id": ("steps", "run_id"), "key": ("steps", "key"),
                   "name": ("steps", "name")},
    "step_complete": {"run_id": ("snapshots", "run_id"), "manifest": ("snapshots", "manifest"),
                      "blobs": ("blobs", "data")},
    "item_complete": {"run_id": ("steps", "run_id"), "result": ("steps", "result")},
    "intent": {"run_id": ("effects", "run_id"), "step_key": ("effects", "step_key"),
               "tool": ("effects", "tool"), "args": ("effects", "args"),
               "args_hash": None},
    "outcome": {"status": None, "result": ("effects", "result"), "error": ("effects", "error")},
    "fact": {"run_id": ("facts", "run_id"), "name": ("facts", "name"), "kind": None,
             "value": ("facts", "value"), "fingerprint": None,
             "check_name": ("facts", "check_name"), "check_args": ("facts", "check_args"),
             "compare_name": ("facts", "compare_name")},
    "stop_request": {"run_id": ("events", "run_id"), "source": ("events", "source"),
                     "who": ("events", "actor"), "reason": ("events", "reason"),
                     "request": None},
    "run_end": {"run_id": ("events", "run_id"), "status": None, "kind": None,
                "source": ("events", "source"), "who": ("events", "actor"),
                "reason": ("events", "reason"), "detail": ("events", "detail"),
                "step_status": None, "step_error": ("steps", "error")},
}  # fmt: skip

# A field declared ``None`` (or a ``plain`` column) holds what kernelext chose: a status, a
# kind, a hash. It is never changed, but checked as a key is (refused when it holds a
# registered secret) unless it is of a type that holds no text.
_PLAIN = ("key", "")


def _record_plan(kind: str) -> dict[str, tuple[str, str]]:
    """(mode, label) of each declared field of a ``kind`` record (``_PLAIN``: only checked)."""
    plan: dict[str, tuple[str, str]] = {}
    for name, where in _RECORD_FIELDS.get(kind, {}).items():
        mode = SCRUBBED.get(where, columns._DEFAULT).mode if where is not None else "plain"
        if where is None or mode == "plain":
            plan[name] = _PLAIN
        else:
            plan[name] = (mode, f"{where[0]}.{where[1]}")
    return plan


_PLANS = {kind: _record_plan(kind) for kind in _RECORD_FIELDS}


def scrub_record(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """A hot-path record as it may be journaled and folded: each field scrubbed as the
    column it lands in (an undeclared field as text, walked when it is a list or a dict).
    As in ``scrub_params``, ids, state and kernelext's own values (``key``, ``exact``,
    plain fields) are checked only while secrets are registered: until then no value holds
    one."""
    s = columns._SCRUBBER
    if s is None:
        return data
    plan = _PLANS.get(kind)
    if plan is None:
        plan = _record_plan(kind)
    refusals = s.armed()
    out = dict(data)
    for name, value in data.items():
        if type(value) in _INERT:
            continue
        how = plan.get(name)
        if how is None:
            mode, label = _T, f"a {kind} record's {name}"
        elif how is _PLAIN:
            if refusals:  # checked, never changed (kernelext's own status enums stay)
                _check(value, f"a {kind} record's {name}")
            continue
        else:
            mode, label = how
        if refusals or mode not in _REFUSING:
            out[name] = _clean(mode, value, label)
    return out
