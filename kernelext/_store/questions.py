"""Questions to a person (``run.ask``, ``kx.questions``): all their SQL.

A question row (table ``questions``) is keyed by the question's key (derived from the
run, the step and the call), answered once (a conditional ``UPDATE … WHERE answered_at
IS NULL``, so of two racing answers exactly one wins) and replayed on every resume. An
answer that cannot be stored comes back as an :class:`Answer` saying why
(``kernelext._core.people.questions`` words it for a person).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NamedTuple

from ..status import TERMINAL
from .base import equal_filters, in_list
from .runs import RunsMixin
from .writer import Tx

__all__ = [
    "ANSWERED",
    "NO_SUCH_QUESTION",
    "PAST_DEADLINE",
    "QUESTION_COLUMNS",
    "Answer",
    "QuestionsMixin",
]

QUESTION_COLUMNS = (
    "key, run_id, step, step_ordinal, call_ordinal, prompt, answer_schema, default_answer,"
    " asked_at, expires_at, answer, answered_at, actor, note"
)
_NAMES = tuple(name.strip() for name in QUESTION_COLUMNS.split(","))
_ASKED = (
    "key",
    "run_id",
    "step",
    "step_ordinal",
    "call_ordinal",
    "prompt",
    "answer_schema",
    "default_answer",
    "asked_at",
    "expires_at",
)

# Why an answer was not stored (``Answer.refused``).
NO_SUCH_QUESTION = "no_such_question"  # no question has that key
ANSWERED = "answered"  # answered already: ``row`` says by whom and when
PAST_DEADLINE = "past_deadline"  # past its deadline


class Answer(NamedTuple):
    """What came of answering: ``refused`` is None when the answer was stored (``row`` is
    the answered question), else ``NO_SUCH_QUESTION``, ``ANSWERED`` or ``PAST_DEADLINE`` with the
    question as it stands."""

    row: dict[str, Any] | None
    refused: str | None = None


class QuestionsMixin(RunsMixin):
    def ask_question(self, row: dict[str, Any]) -> None:
        """Record a question (or ask an unanswered one again, with a new deadline)."""

        def job(tx: Tx) -> None:
            values = {**row, "asked_at": self.now()}
            tx.execute(
                f"INSERT INTO questions ({', '.join(_ASKED)}) VALUES"
                f" ({', '.join('?' for _ in _ASKED)}) ON CONFLICT (key) DO UPDATE SET"
                " prompt = excluded.prompt, answer_schema = excluded.answer_schema,"
                " default_answer = excluded.default_answer, asked_at = excluded.asked_at,"
                " expires_at = excluded.expires_at",
                tuple(values.get(name) for name in _ASKED),
            )
            self.event(
                tx,
                row["run_id"],
                "input_requested",
                source="agent",
                detail={"key": str(row["key"]), "step": row["step"], "prompt": row["prompt"]},
            )

        self.write(job)

    def question_row(self, key: uuid.UUID) -> dict[str, Any] | None:
        """The question ``key`` (answered or not), or None."""
        table = self.questions_table
        rows = self.read_dicts(f"SELECT {QUESTION_COLUMNS} FROM {table} WHERE key = ?", (key,))
        return rows[0] if rows else None

    def question_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every question (answered ones too), oldest first."""
        where, params = equal_filters(("run_id", run_id))
        return self.read_dicts(
            f"SELECT {QUESTION_COLUMNS} FROM {self.questions_table}{where} ORDER BY asked_at, key",
            params,
        )

    def open_questions(self, run_id: str | None, now: dt.datetime) -> list[dict[str, Any]]:
        """Questions waiting for an answer, not expired, of runs that can still go on."""
        cols = ", ".join(f"q.{name}" for name in _NAMES)
        ended, terminal = in_list(TERMINAL)
        sql = (
            f"SELECT {cols} FROM {self.questions_table} q JOIN runs r ON r.id = q.run_id"
            " WHERE q.answered_at IS NULL AND (q.expires_at IS NULL OR q.expires_at > ?)"
            f" AND r.status NOT IN {ended}"
        )
        params: list[Any] = [now, *terminal]
        if run_id is not None:
            sql += " AND q.run_id = ?"
            params.append(run_id)
        return self.read_dicts(sql + " ORDER BY q.asked_at, q.key", params)

    def answer_question(
        self, key: uuid.UUID, answer: str, *, who: str, note: str | None, source: str = "api"
    ) -> Answer:
        """Store the answer (JSON) to question ``key``, once: an answered, expired or
        unknown question changes nothing and is refused in the result."""

        def job(tx: Tx) -> Answer:
            now = self.now()
            found = _question_tx(tx, key)
            if found is None:
                return Answer(None, NO_SUCH_QUESTION)
            won = tx.fetchone(
                "UPDATE questions SET answer = ?, answered_at = ?, actor = ?, note = ?"
                " WHERE key = ? AND answered_at IS NULL"
                " AND (expires_at IS NULL OR expires_at > ?) RETURNING key",
                (answer, now, who, note, key, now),
            )
            if won is None:
                latest = _question_tx(tx, key) or found
                return Answer(
                    latest, ANSWERED if latest["answered_at"] is not None else PAST_DEADLINE
                )
            found.update(answer=answer, answered_at=now, actor=who, note=note)
            self.event(
                tx,
                found["run_id"],
                "input_answered",
                source=source,
                who=who,
                reason=note,
                detail={"key": str(key), "step": found["step"]},
            )
            return Answer(found)

        return self.write(job)


def _question_tx(tx: Tx, key: uuid.UUID) -> dict[str, Any] | None:
    found = tx.fetchone(f"SELECT {QUESTION_COLUMNS} FROM questions WHERE key = ?", (key,))
    return dict(zip(_NAMES, found, strict=True)) if found else None
