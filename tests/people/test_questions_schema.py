"""Schema 8: the table of questions is ``questions``; ``inputs`` stays as a read-only view.

A store a release at schema 7 left (questions in the table ``inputs``) opens with this
release: the migration renames the table, the open questions are still open, answered
ones are replayed on resume (never asked again), and SQL written against ``inputs``
still reads the same rows. Real runs on a real DuckDB store; the PostgreSQL side is in
the conformance suite (``TestQuestions``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.live import finish_live_runs, name
from support.old_schema import back_to_schema

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store
from kernelext._store.compat import NEWEST_SCHEMA
from kernelext.errors import ReadOnlyError

WAIT = 60.0


def seats_agent() -> kx.Agent:
    @kx.agent(name=name("seats"))
    def seats(run: kx.Run) -> int:
        count: int = run.ask("How many seats?", schema=int)
        for _ in run.steps(["pause"]):
            if not run.state.get("paused"):
                run.state["paused"] = True
                run.suspend("other")  # the run waits after the answer: it is replayed later
        return count

    return seats


def asked(store: Store, run_id: str) -> int:
    return [e["kind"] for e in store.events(run_id)].count("input_requested")


def test_a_store_at_schema_7_opens_with_its_questions_and_replays_the_answered_ones(
    store: Store, store_path: Path
) -> None:
    agent = seats_agent()
    answered, waiting = name("answered"), name("waiting")
    assert agent.start(run_id=answered).wait(WAIT) == "suspended"
    assert agent.start(run_id=waiting).wait(WAIT) == "suspended"
    handle = kx.answer(answered, 3)
    assert handle is not None and handle.wait(WAIT) == "suspended"  # the later pause
    finish_live_runs()
    back_to_schema(store, 7)
    assert store.schema_version() == 7
    assert store.read("SELECT count(*) FROM inputs") == [(2,)]  # the table of schema 7
    runtime().close()

    reopened = kx.open_store(str(store_path))
    assert reopened.schema_version() == NEWEST_SCHEMA
    assert [q.run_id for q in kx.questions()] == [waiting]  # still open
    [row] = reopened.question_rows(answered)
    assert json.loads(row["answer"]) == 3
    final = kx.resume(answered)
    assert final.wait(WAIT) == "completed" and final.result == 3  # replayed
    assert asked(reopened, answered) == 1  # never asked again
    assert kx.answer(waiting, 2).wait(WAIT) == "suspended"


def test_sql_written_against_inputs_reads_the_questions(store: Store) -> None:
    run_id = name("view")
    assert seats_agent().start(run_id=run_id).wait(WAIT) == "suspended"
    query = "SELECT run_id, prompt, answered_at IS NULL AS open FROM {} ORDER BY asked_at"
    through_view = kx.sql(query.format("inputs")).to_dict("records")
    assert through_view == kx.sql(query.format("questions")).to_dict("records")
    assert through_view == [{"run_id": run_id, "prompt": "How many seats?", "open": True}]
    with pytest.raises(ReadOnlyError):
        kx.sql("DELETE FROM inputs")


def test_a_store_at_schema_7_opened_read_only_reads_its_questions_from_inputs(
    store: Store, store_path: Path
) -> None:
    """A read-only open runs no migration: the questions are still in ``inputs``."""
    run_id = name("readonly")
    assert seats_agent().start(run_id=run_id).wait(WAIT) == "suspended"
    finish_live_runs()
    back_to_schema(store, 7)
    runtime().close()

    old = kx.open_store(str(store_path), read_only=True)
    try:
        assert old.schema_version() == 7  # nothing was migrated
        [question] = kx.questions(store=old)
        assert (question.run_id, question.prompt) == (run_id, "How many seats?")
        [row] = old.question_rows(run_id)
        assert row["answered_at"] is None
        assert "How many seats?" in kx.plan(run_id, store=old).text()
    finally:
        old.close()
