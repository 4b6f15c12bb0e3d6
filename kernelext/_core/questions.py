"""Questions to a person: ``run.ask`` asks, ``kx.questions`` lists, ``kx.answer`` answers.

A question is answered once and replayed on every resume (its SQL: ``_store/questions.py``).

The run suspends with reason ``input`` at the question (the step it is in ends
``cancelled`` and runs again on resume, its applied effects replayed from the ledger).
``kx.answer`` stores the answer after checking it against the question's schema; the
resumed run gets it back from ``run.ask``, and so does every later resume, without
asking again. Schemas are a small set: ``str``, ``int``, ``float``, ``bool``, a list of
choices, or a JSON-schema dict (``type``, ``enum``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``properties``/``required`` for a small form, ``items``).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import TYPE_CHECKING, Any

from .._store import Store, actor
from .._store.questions import NO_SUCH_QUESTION
from .._validate import (
    FLAG,
    NOTE,
    OPTIONAL_RUN_ID,
    RUN_ID,
    SOURCE,
    STORE,
    check_key,
    optional,
    validated,
)
from ..errors import LedgerError, RunStateError
from ..status import Reason
from .approvals import stamp, time_left_text
from .codec import dumps_json, loads_json
from .keys import question_key
from .runtime import get_store, runtime
from .waiting import Waiting, resume_if_here, wait_for_person

if TYPE_CHECKING:
    from .run_engine import RunEngine

__all__ = [
    "Question",
    "Questions",
    "answer",
    "answer_refusal",
    "ask",
    "check_answer",
    "encode_answer",
    "parse_answer",
    "question_key",
    "questions",
    "schema_spec",
    "store_answer",
]

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


# -- kx.questions, kx.answer -------------------------------------------------------------
class Question:
    """One open ``run.ask`` question. Answer it with ``.answer(value)``."""

    def __init__(self, store: Store, row: dict[str, Any]) -> None:
        self.store = store
        self.row = row
        self.key: uuid.UUID = row["key"]
        self.run_id: str = row["run_id"]
        self.step: str = row["step"]
        self.prompt: str = row["prompt"]
        self.schema: dict[str, Any] = json.loads(row["answer_schema"] or "{}")
        self.default: Any = (
            loads_json(row["default_answer"]) if row["default_answer"] is not None else None
        )
        self.asked_at: dt.datetime = row["asked_at"]
        self.expires_at: dt.datetime | None = row["expires_at"]
        self.answered = row["answered_at"] is not None
        self.handle: Any = None

    @property
    def time_left(self) -> str:
        return time_left_text(self.expires_at, self.store.now())

    def check(self, value: Any) -> None:
        """Raise ``ValueError`` (saying what fits) unless ``value`` answers the question."""
        try:
            check_answer(self.schema, value)
        except ValueError as exc:
            raise ValueError(
                f"Answer refused for {self.prompt!r} (run {self.run_id!r}): {exc} Nothing was "
                f"stored; answer again with a value that fits (schema {json.dumps(self.schema)})."
            ) from None

    @validated("Question.answer", note=NOTE, source=SOURCE, resume=FLAG)
    def answer(
        self,
        value: Any = _UNSET,
        *,
        note: str | None = None,
        source: str = "api",
        resume: bool = True,
    ) -> Any:
        """Store the answer (the default without ``value``) and resume the run when this
        process runs it (returns its new handle); else its next ``kx.resume`` goes on."""
        if value is _UNSET:
            if self.default is None:
                raise ValueError(f"The question {self.prompt!r} has no default: give a value.")
            value = self.default
        self.check(value)
        try:
            encoded = encode_answer(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"Question.answer(value=...) for {self.prompt!r} (run {self.run_id!r}) takes a "
                "value that can be stored as JSON: text, a number, True/False, None, or a "
                f"list or dict of those; not {type(value).__name__} ({exc}). Nothing was "
                "stored; answer again with such a value (e.g. str(value))."
            ) from None
        note = (note or "").strip() or None
        self.row = store_answer(
            self.store, self.key, encoded, who=actor(), note=note, source=source
        )
        self.answered = True
        if resume:
            self.handle = resume_if_here(self.store, self.run_id, source)
        return self.handle

    def answer_text(self, text: str, **kwargs: Any) -> Any:
        """Answer with typed text, read as the schema asks (a number, true/false, JSON)."""
        return self.answer(parse_answer(self.schema, text), **kwargs)

    def describe(self) -> str:
        return (
            f"{self.prompt!r} run={self.run_id} step={self.step!r} "
            f"schema={json.dumps(self.schema)} {self.time_left}"
        )

    def __repr__(self) -> str:
        return f"<question {self.describe()} {'answered' if self.answered else 'open'}>"


class Questions(Waiting[Question]):
    """Open questions. In a notebook it displays as the questions widget."""

    def text(self) -> str:
        scope = f"Run {self.run_id}" if self.run_id else "All runs"
        if not self:
            return f"{scope}: no question waits."
        lines = [f"{scope}: {sum(not q.answered for q in self)} question(s) waiting"]
        lines += [f"  {q.describe()}" for q in self]
        lines.append("Answer each: .answer(value)  (or kx.answer(run_id, value))")
        return "\n".join(lines)


@validated("kx.questions", run_id=OPTIONAL_RUN_ID, store=STORE)
def questions(run_id: str | None = None, *, store: Store | None = None) -> Questions:
    """The questions (``run.ask``) waiting for an answer (of one run, or of every run)."""
    store = get_store(store)
    if run_id is not None:
        store.get_run(run_id)
    rows = store.open_questions(run_id, store.now())
    return Questions(run_id, store, [Question(store, row) for row in rows])


@validated(
    "kx.answer",
    run_id=RUN_ID,
    key=optional(check_key),
    note=NOTE,
    text=FLAG,
    store=STORE,
    source=SOURCE,
    resume=FLAG,
)
def answer(
    run_id: str,
    value: Any = _UNSET,
    *,
    key: str | uuid.UUID | None = None,
    note: str | None = None,
    text: bool = False,
    store: Store | None = None,
    source: str = "api",
    resume: bool = True,
) -> Any:
    """Answer the open question of run ``run_id`` (``key`` picks one when several wait).

    The answer must fit the question's schema (else ``ValueError`` says what fits; nothing
    is stored). ``text=True``: ``value`` is typed text, read as the schema asks. Resumes
    the run when this process runs it and returns its new handle; else None.
    """
    store = get_store(store)
    open_ones = questions(run_id, store=store)
    if key is not None:
        wanted = str(key).strip().lower()
        open_ones = Questions(
            run_id, store, [q for q in open_ones if str(q.key).startswith(wanted)]
        )
    if len(open_ones) != 1:
        listing = "; ".join(f"{q.key}: {q.prompt!r}" for q in open_ones) or "none"
        raise LedgerError(
            f"Run {run_id!r} has {len(open_ones)} open question(s) "
            + ("matching that key " if key is not None else "")
            + f"({listing}); "
            + ("pass key=... to pick one." if open_ones else "nothing to answer.")
        )
    question = open_ones[0]
    if text:
        if value is _UNSET:
            raise ValueError("answer(..., text=True) needs the typed text as value.")
        return question.answer_text(str(value), note=note, source=source, resume=resume)
    return question.answer(value, note=note, source=source, resume=resume)


def store_answer(
    store: Store, key: uuid.UUID, encoded: str, *, who: str, note: str | None, source: str = "api"
) -> dict[str, Any]:
    """Store the answer (JSON) to question ``key`` once; else ``RunStateError`` says why
    (unknown, answered already, or expired); nothing changes then."""
    result = store.answer_question(key, encoded, who=who, note=note, source=source)
    if result.row is None or result.refused == NO_SUCH_QUESTION:
        raise RunStateError(
            f"No question with key {key} in the store at {store.location}. List the open "
            "ones with kx.questions() (or `kernelext approvals`)."
        )
    if result.refused is not None:
        raise RunStateError(answer_refusal(result.row))
    return result.row


def answer_refusal(row: dict[str, Any]) -> str:
    """Why question ``row`` cannot be answered (answered already, or expired)."""
    what = f"The question {row['prompt']!r} of run {row['run_id']!r}"
    if row["answered_at"] is not None:
        return (
            f"{what} was already answered by {row['actor']} at {stamp(row['answered_at'])}; "
            "its answer is kept and replayed on resume."
        )
    return (
        f"{what} expired at {stamp(row['expires_at'])} with its run's deadline and can no "
        f"longer be answered. kx.restart({row['run_id']!r}) starts a new run from its "
        "snapshot, which asks again."
    )
