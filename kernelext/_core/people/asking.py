"""Asking a person from inside a run: ``run.ask`` (listing and answering: ``questions.py``).

The run suspends with reason ``input`` at the question (the step it is in ends
``cancelled`` and runs again on resume, its applied effects replayed from the ledger).
A question answered before is replayed without asking again. Schemas are a small set:
``str``, ``int``, ``float``, ``bool``, a list of choices, or a JSON-schema dict (``type``,
``enum``, ``minimum``/``maximum``, ``minLength``/``maxLength``, ``properties``/``required``
for a small form, ``items``). This half runs in the agent's thread and never resumes a
run, so it imports nothing that does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...status import Reason
from ..encoding.codec import dumps_json, loads_json
from ..encoding.keys import question_key
from ..process.runtime import runtime
from .waiting import wait_for_person

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine

__all__ = ["ask", "check_answer", "encode_answer", "parse_answer", "schema_spec"]

_UNSET: Any = object()
_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_KINDS = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}
_TRUE = {"true", "yes", "y", "1", "on"}
_FALSE = {"false", "no", "n", "0", "off"}


# -- schemas ------------------------------------------------------------------------------
def schema_spec(schema: Any) -> dict[str, Any]:
    """``schema`` as a JSON-schema dict: ``{}`` (any JSON value) for None, ``{"type": ...}``
    for ``str``/``int``/``float``/``bool``, ``{"enum": [...]}`` for a list of choices."""
    if schema is None:
        return {}
    if isinstance(schema, type) and schema in _TYPES:
        return {"type": _TYPES[schema]}
    if isinstance(schema, (list, tuple)):
        if not schema:
            raise ValueError("run.ask(schema=[...]) needs at least one choice.")
        choices = list(schema)
        dumps_json(choices)  # choices are stored: JSON values only
        return {"enum": choices}
    if isinstance(schema, dict):
        try:
            json.dumps(schema)
        except (TypeError, ValueError):
            raise ValueError("A JSON-schema dict for run.ask must be JSON itself.") from None
        _check_schema_types(schema, "schema")
        return dict(schema)
    raise TypeError(
        f"run.ask(schema=...) takes str, int, float, bool, a list of choices or a JSON-schema "
        f"dict, not {schema!r}."
    )


def _check_schema_types(spec: dict[str, Any], where: str) -> None:
    """Refuse a ``"type"`` run.ask cannot check (here and in ``properties``/``items``):
    an unknown type would accept any answer, even one that cannot be stored."""
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [] if kind is None else [kind]
    supported = ", ".join(map(repr, _KINDS))
    for one in kinds:
        if not isinstance(one, str) or one not in _KINDS:
            raise ValueError(
                f"run.ask({where}=...) has the JSON-schema type {one!r}, which run.ask does not "
                f"know; the supported types are {supported} (or a list of them)."
            )
    fields = spec.get("properties")
    if isinstance(fields, dict):
        for name, sub in fields.items():
            if isinstance(sub, dict):
                _check_schema_types(sub, f"{where}['properties'][{name!r}]")
    if isinstance(spec.get("items"), dict):
        _check_schema_types(spec["items"], f"{where}['items']")


def check_answer(spec: dict[str, Any], value: Any, where: str = "the answer") -> None:
    """Raise ``ValueError`` naming what does not fit when ``value`` does not fit ``spec``."""
    if "enum" in spec and value not in spec["enum"]:
        options = ", ".join(json.dumps(c) for c in spec["enum"])
        raise ValueError(f"{where} must be one of {options}; got {_show(value)}.")
    kind = spec.get("type")
    kinds: list[str] = [str(k) for k in kind] if isinstance(kind, list) else [kind] if kind else []
    if kinds and not any(_is(value, k) for k in kinds):
        wanted = " or ".join(_NAMES.get(k, k) for k in kinds)
        raise ValueError(f"{where} must be {wanted}; got {_show(value)}.")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in spec and value < spec["minimum"]:
            raise ValueError(f"{where} must be at least {spec['minimum']}; got {value}.")
        if "maximum" in spec and value > spec["maximum"]:
            raise ValueError(f"{where} must be at most {spec['maximum']}; got {value}.")
    if isinstance(value, str):
        if "minLength" in spec and len(value) < spec["minLength"]:
            raise ValueError(f"{where} needs at least {spec['minLength']} character(s).")
        if "maxLength" in spec and len(value) > spec["maxLength"]:
            raise ValueError(f"{where} takes at most {spec['maxLength']} character(s).")
    if isinstance(value, dict):
        fields = spec.get("properties") or {}
        for name in spec.get("required") or ():
            if name not in value:
                raise ValueError(f"{where} needs the field {name!r}.")
        if spec.get("additionalProperties") is False:
            extra = sorted(set(value) - set(fields))
            if extra:
                raise ValueError(f"{where} has unknown field(s) {', '.join(map(repr, extra))}.")
        for name, sub in fields.items():
            if name in value and isinstance(sub, dict):
                check_answer(sub, value[name], f"field {name!r}")
    if isinstance(value, list) and isinstance(spec.get("items"), dict):
        for index, item in enumerate(value):
            check_answer(spec["items"], item, f"item {index} of {where}")


_NAMES = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object (a dict)",
    "array": "a list",
    "null": "null",
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _KINDS.get(kind, (object,)))


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def parse_answer(spec: dict[str, Any], text: str) -> Any:
    """An answer typed as text (command line, text box) as the value ``spec`` asks for."""
    kind = spec.get("type")
    stripped = text.strip()
    if "enum" in spec:
        for choice in spec["enum"]:
            if stripped == (choice if isinstance(choice, str) else json.dumps(choice)):
                return choice
        return _json_or_text(stripped)
    if kind == "string":
        return text
    if kind == "boolean":
        if stripped.lower() in _TRUE:
            return True
        if stripped.lower() in _FALSE:
            return False
        return stripped
    if kind in ("integer", "number"):
        try:
            number = float(stripped) if kind == "number" or "." in stripped else int(stripped)
        except ValueError:
            return stripped
        return int(number) if kind == "integer" and float(number).is_integer() else number
    return _json_or_text(stripped)  # objects, lists, and answers without a schema


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def encode_answer(value: Any) -> str:
    """The JSON an answer is stored (and replayed) as; the store's write path redacts names
    that look like secrets and registered values, as in effect results (store/columns.py)."""
    return dumps_json(value).decode()


# -- run.ask -----------------------------------------------------------------------------
def ask(run: RunEngine, prompt: str, *, schema: Any = None, default: Any = None) -> Any:
    """Ask a person; see ``Run.ask``."""
    run.enforce_stop("run.ask")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("run.ask needs a prompt: the question the person reads.")
    spec = schema_spec(schema)
    if default is not None:
        check_answer(spec, default, "the default")
    step_key, step_ordinal, call_ordinal = run.next_call()
    key = question_key(run.id, step_key, call_ordinal, run.key_scheme)
    store = run.store
    row = store.question_row(key)
    if row is not None and row["answered_at"] is not None:
        run.notify("input", (prompt, key, "replayed"))
        return loads_json(row["answer"]) if row["answer"] is not None else None
    now = store.now()
    deadline = row["expires_at"] if row is not None else None
    if deadline is None or deadline <= now:
        deadline = runtime().settings.expiry.deadline(Reason.INPUT, now)
        with run.force.critical():
            store.ask_question(
                {
                    "key": key,
                    "run_id": run.id,
                    "step": step_key,
                    "step_ordinal": step_ordinal,
                    "call_ordinal": call_ordinal,
                    "prompt": prompt,
                    "answer_schema": json.dumps(spec, sort_keys=True),
                    "default_answer": None if default is None else encode_answer(default),
                    "expires_at": deadline,
                }
            )
    run.notify("input", (prompt, key, "asked"))
    wait_for_person(
        run, Reason.INPUT, deadline, f"waiting for an answer: kx.answer({run.id!r}, ...)"
    )
