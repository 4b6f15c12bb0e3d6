"""``run.fact``: recording the premises a run depends on, and re-checking them.

A fact is a value the rest of the run relies on (a price, a record's version, an
approval) plus how to obtain it again: a named check function and JSON arguments.
The fact row is queued when ``run.fact`` is called and is durable no later than the
step's completion (the store's writer is first-in, first-out). Values are stored
as JSON, never pickled.

On resume every fact recorded by a completed step (or outside any step) is
re-checked before anything runs: ``check(*args)`` is called with a time bound
(the ``check_timeout`` setting) and compared with the recorded value, by equality,
within ``tolerance`` for numbers, or by a comparator ``compare(recorded, current)``
returning true when the fact still holds. The outcome of each is stored in the
``facts`` table: ``ok``, ``changed``, ``error`` (the check or comparator raised),
``timeout`` or ``unresolved`` (the check cannot be found in this process). Anything
but ``ok`` is a contradiction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import SerializationError
from ..encoding.codec import dumps_json, loads_json
from ..process.checks import (
    call_bounded,
    qualified_name,
    remember_local,
    resolve,
    warn_not_portable,
)
from ..process.runtime import runtime
from . import credentials

if TYPE_CHECKING:
    from ..._store import Store
    from ..engine.run_engine import RunEngine

__all__ = ["CONTRADICTIONS", "KINDS", "recheck", "record_fact", "still_holds"]

KINDS = ("value", "credential")
CONTRADICTIONS = frozenset({"changed", "error", "timeout", "unresolved"})


def record_fact(
    run: RunEngine,
    name: str,
    value: Any,
    check: Callable[..., Any] | None = None,
    args: Any = (),
    *,
    tolerance: float | None = None,
    kind: str = "value",
    compare: Callable[[Any, Any], Any] | None = None,
) -> Any:
    """Record fact ``name`` = ``value`` for run ``run`` and return ``value`` unchanged."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"A fact needs a non-empty string name, not {name!r}.")
    if kind not in KINDS:
        raise ValueError(f"Fact {name!r}: kind must be one of {KINDS}, not {kind!r}.")
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise TypeError(
            f"Fact {name!r}: args must be a tuple or list of JSON values, e.g. "
            f"args=(sku,), not {type(args).__name__}."
        )
    try:
        args_text = dumps_json(list(args)).decode()
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"Fact {name!r}: the check arguments must be JSON-serialisable (strings, numbers, "
            f"lists, dicts) so that a fresh kernel can call the check again; "
            f"{_culprit(exc)} is not. Pass an identifier instead of the object."
        ) from None
    if kind == "credential":
        return _record_credential(run, name, value, check, args_text, tolerance, compare)
    try:
        encoded = dumps_json(value).decode()
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"Fact {name!r}: the value must be JSON-serialisable to be stored safely (never "
            f"pickled); {_culprit(exc)} is not. Record a plain value (number, string, list, "
            "dict), e.g. a version or a hash of the object."
        ) from None
    if tolerance is not None:
        if compare is not None:
            raise ValueError(f"Fact {name!r}: give either tolerance= or compare=, not both.")
        if not _is_number(value):
            raise TypeError(
                f"Fact {name!r}: tolerance= applies to numbers; the value is a "
                f"{type(value).__name__}. Use compare=fn(recorded, current) instead."
            )
        tolerance = float(tolerance)
        if not tolerance >= 0:
            raise ValueError(f"Fact {name!r}: tolerance must be zero or more, not {tolerance}.")
    if check is None and runtime().checks.lookup(name) is None:
        raise TypeError(
            f"Fact {name!r} needs a way to be re-checked on resume: pass check=fn (a named "
            f"function, with args=) or register one with kx.checks.register({name!r}, fn)."
        )
    check_name = _portable_name(run, name, check, "check")
    compare_name = _portable_name(run, name, compare, "compare")
    _queue(run, name, "value", encoded, None, check_name, args_text, tolerance, compare_name)
    return value


def _record_credential(
    run: RunEngine,
    name: str,
    value: Any,
    check: Callable[..., Any] | None,
    args_text: str,
    tolerance: float | None,
    compare: Callable[..., Any] | None,
) -> Any:
    if tolerance is not None or compare is not None:
        raise ValueError(
            f"Credential {name!r}: tolerance= and compare= do not apply; a "
            "credential is refreshed on resume, not compared."
        )
    if value is None:
        raise ValueError(f"Credential {name!r} is None; record the credential itself.")
    refresh_name = _portable_name(run, name, check, "refresh", stacklevel=6)
    credentials.remember(run.id, name, value)
    _queue(
        run,
        name,
        "credential",
        None,
        credentials.fingerprint(value),
        refresh_name,
        args_text,
        None,
        None,
    )
    return value


def _portable_name(
    run: RunEngine, fact: str, fn: Callable[..., Any] | None, role: str, stacklevel: int = 5
) -> str | None:
    if fn is None:
        return None
    if not callable(fn):
        raise TypeError(f"Fact {fact!r}: {role}= must be a function, not {type(fn).__name__}.")
    name, portable = qualified_name(fn)
    if not portable:
        warn_not_portable(role, fact, name, stacklevel)
        remember_local(run.id, fact, role, fn)
    return name


def _queue(
    run: RunEngine,
    name: str,
    kind: str,
    value: str | None,
    fp: str | None,
    check_name: str | None,
    args_text: str,
    tolerance: float | None,
    compare_name: str | None,
) -> None:
    info = run.current
    row = {
        "run_id": run.id,
        "name": name,
        "kind": kind,
        "value": value,
        "fingerprint": fp,
        "check_name": check_name,
        "check_args": args_text,
        "tolerance": tolerance,
        "step_ordinal": info.ordinal if info is not None else None,
        "compare_name": compare_name,
    }
    with run.force.critical():
        run.store.record_fact(row)
    run.notify("fact", (name, kind))


def _culprit(exc: BaseException) -> str:
    obj = exc.args[0] if exc.args and not isinstance(exc.args[0], str) else None
    return f"a {type(obj).__name__} value" if obj is not None else "one of them"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- re-checking ------------------------------------------------------------------------------
def still_holds(
    recorded: Any, current: Any, tolerance: float | None, compare: Callable[[Any, Any], Any] | None
) -> bool:
    """Whether ``current`` confirms ``recorded``."""
    if compare is not None:
        return bool(compare(recorded, current))
    if tolerance is not None and _is_number(recorded) and _is_number(current):
        if math.isnan(recorded) or math.isnan(current):
            return False
        return abs(float(recorded) - float(current)) <= tolerance
    return bool(recorded == current)


def recheck(
    run: RunEngine, store: Store, rows: Sequence[dict[str, Any]], timeout: float
) -> list[dict[str, Any]]:
    """Re-check value facts; store and return one result per row (see module doc)."""
    plans: list[tuple[Callable[..., Any] | None, Callable[..., Any] | None, str]] = []
    calls: list[Callable[[], Any]] = []
    for row in rows:
        check, why = resolve(row["check_name"], run_id=run.id, fact=row["name"])
        compare: Callable[..., Any] | None = None
        if check is not None and row.get("compare_name"):
            compare, why = resolve(
                row["compare_name"], run_id=run.id, fact=row["name"], role="compare"
            )
            if compare is None:
                check = None
        plans.append((check, compare, why))
        calls.append(_bind(check, loads_json(row["check_args"] or "[]")) if check else _none)
    outcomes = call_bounded(calls, timeout)
    now = store.now()
    results: list[dict[str, Any]] = []
    for row, (check, compare, why), outcome in zip(rows, plans, outcomes, strict=True):
        status, current, detail = _judge(
            row, check, compare, why, outcome.status, outcome.value, outcome.detail
        )
        results.append(
            {
                "name": row["name"],
                "checked_at": now,
                "current_value": current,
                "status": status,
                "detail": detail,
                "fingerprint": None,
            }
        )
    store.save_fact_checks(run.id, results)
    return results


def _judge(
    row: dict[str, Any],
    check: Callable[..., Any] | None,
    compare: Callable[..., Any] | None,
    why: str,
    outcome: str,
    value: Any,
    detail: str,
) -> tuple[str, str | None, str]:
    if check is None:
        return "unresolved", None, why
    if outcome == "timeout":
        return "timeout", None, f"the check did not answer: {detail}"
    if outcome == "error":
        return "error", None, f"the check raised {detail}"
    try:
        current_text = dumps_json(value).decode()
    except (TypeError, ValueError):
        return (
            "error",
            None,
            (
                f"the check returned a {type(value).__name__}, which cannot be "
                "compared with the recorded JSON value"
            ),
        )
    recorded = loads_json(row["value"]) if row["value"] is not None else None
    try:
        holds = still_holds(recorded, loads_json(current_text), row.get("tolerance"), compare)
    except Exception as exc:  # a broken comparator is a contradiction
        return "error", current_text, f"the comparator raised {type(exc).__name__}: {exc}"
    if holds:
        return "ok", current_text, ""
    tol = row.get("tolerance")
    return (
        "changed",
        current_text,
        ("differs from the recorded value" + (f" by more than {tol:g}" if tol is not None else "")),
    )


def _bind(fn: Callable[..., Any], args: list[Any]) -> Callable[[], Any]:
    return lambda: fn(*args)


def _none() -> None:
    return None
