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

from ..._formatting import step_label
from ..._shown import shows
from ..._store import Store, actor
from ..._store.questions import NO_SUCH_QUESTION
from ..._validate import (
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
from ...errors import LedgerError, RunStateError
from ..encoding.codec import loads_json
from ..encoding.keys import question_key
from ..process.runtime import get_store
from .approvals import stamp, time_left_text
from .asking import check_answer, encode_answer, parse_answer
from .waiting import Waiting, go_on

if TYPE_CHECKING:
    pass

_UNSET: Any = object()  # no value given: the default answers

__all__ = [
    "Question",
    "Questions",
    "answer",
    "answer_refusal",
    "pick_question",
    "question_key",
    "questions",
    "store_answer",
]


# -- kx.questions, kx.answer -------------------------------------------------------------
class Question:
    """One open ``run.ask`` question. Answer it with ``.answer(value)``."""

    def __init__(self, store: Store, row: dict[str, Any]) -> None:
        self.store = store
        self.row = row
        self.key: uuid.UUID = row["key"]
        self.run_id: str = row["run_id"]
        self.step: str = row["step"]
        self.step_ordinal: int | None = row.get("step_ordinal")
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
        self.record(encoded, who=actor(), note=note, source=source)
        if resume:
            self.handle = go_on(self.store, self.run_id, source)
        return self.handle

    def record(self, encoded: str, *, who: str, note: str | None, source: str) -> None:
        """Store the checked answer (JSON) once, as ``who``: the one door of every answer
        (``kx.answer``, ``kernelext answer``, the panel's card, the notebook server)."""
        note = (note or "").strip() or None
        self.row = store_answer(self.store, self.key, encoded, who=who, note=note, source=source)
        self.answered = True

    def answer_text(self, text: str, **kwargs: Any) -> Any:
        """Answer with typed text, read as the schema asks (a number, true/false, JSON)."""
        return self.answer(parse_answer(self.schema, text), **kwargs)

    @property
    def step_text(self) -> str:
        """``step 1``, ``step 2 (review)``: the step that asks, as every surface shows it."""
        return step_label(self.step_ordinal, self.step)

    def describe(self) -> str:
        return (
            f"{self.prompt!r} run={self.run_id} {self.step_text} "
            f"schema={json.dumps(self.schema)} {self.time_left}"
        )

    @shows
    def __repr__(self) -> str:
        return f"<question {self.describe()} {'answered' if self.answered else 'open'}>"


class Questions(Waiting[Question]):
    """Open questions. In a notebook it displays as the questions widget."""

    @shows
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
    question = pick_question(get_store(store), run_id, key)
    if text:
        if value is _UNSET:
            raise ValueError("answer(..., text=True) needs the typed text as value.")
        return question.answer_text(str(value), note=note, source=source, resume=resume)
    return question.answer(value, note=note, source=source, resume=resume)


def pick_question(store: Store, run_id: str, key: str | uuid.UUID | None = None) -> Question:
    """The one open question of run ``run_id`` (``key``, or its start, picks one when several
    wait); else ``LedgerError`` lists the open ones."""
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
    return open_ones[0]


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
