"""A question's answer through the notebook server (``POST kernelext/api/answer``), over
real HTTP, on DuckDB and on PostgreSQL.

A real Jupyter server (JupyterLab's, kernelext's extension enabled) stores the answer while
the kernel may be busy, checked against the question's schema and read as typed, through
the door of ``kernelext answer``: one answer wins, a later one (from a terminal or another
panel) is refused saying who answered and when. The question's card then asks its kernel
to resume the run, which gets the answer back from ``run.ask``.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import pytest
from browser import jupyterlab as lab
from support.route import module_lab_server, post  # noqa: F401  (the fixture `server`)

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def asking(run_id: str, seen: list[Any]) -> Any:
    """Start a run that asks how many seats (an int) and waits; returns its handle."""
    import kernelext as kx

    @kx.agent(name="asks-seats")
    def seats(run: kx.Run) -> None:
        with run.step("ask"):
            seen.append(run.ask("How many seats?", schema=int))

    handle = seats.start(run_id=run_id)
    assert handle.wait(60) == "suspended"
    return handle


def question_rows(store: Any, run_id: str) -> list[dict[str, Any]]:
    return [row for row in store.question_rows(run_id)]


def test_an_answer_through_the_server_is_stored_once_and_the_card_resumes_the_run(
    server: lab.LabServer, store: Any, store_path: Any
) -> None:
    import kernelext as kx
    from kernelext._core.people.questions import Question
    from kernelext.widgets._questions import QuestionCard

    seen: list[Any] = []
    asking("answer-through-server", seen)
    (question,) = kx.questions("answer-through-server")
    body = {
        "run_id": "answer-through-server",
        "store": str(store_path),
        "key": str(question.key),
        "answer": "12",
        "typed": True,
        "note": "from the panel",
    }
    status, answer = post(server, "answer", {**body, "key": str(uuid.uuid4())})
    assert status == 400 and "has no question" in answer["message"]
    status, answer = post(server, "answer", {**body, "run_id": "another-run"})
    assert status == 404  # a run the store does not hold
    status, answer = post(server, "answer", {**body, "answer": "twelve"})
    assert status == 400 and "must be a whole number" in answer["message"]
    status, answer = post(server, "answer", {**body, "typed": False})  # "12" is text, not int
    assert status == 400 and "must be a whole number" in answer["message"]
    (row,) = question_rows(store, "answer-through-server")
    assert row["answered_at"] is None  # every refusal left it open
    status, answer = post(server, "answer", body)
    assert status == 200, answer
    assert answer["answered"] and "goes on as soon as its kernel" in answer["message"]
    status, again = post(server, "answer", {**body, "answer": "3"})  # one answer wins
    assert status == 409 and "already answered by" in again["message"]
    (row,) = question_rows(store, "answer-through-server")
    assert (json.loads(row["answer"]), row["note"]) == (12, "from the panel")
    answered = [e for e in store.events("answer-through-server") if e["kind"] == "input_answered"]
    assert [e["source"] for e in answered] == ["panel"]
    assert seen == []  # stored, not yet resumed: the kernel does that
    card = QuestionCard(Question(store, row))
    card.buttons._handle_message(card.buttons, {"action": "resume"}, [])
    assert card.buttons.ack_seq == 1 and card.buttons.decided
    assert card.handle is not None and card.handle.wait(60) == "completed"
    assert seen == [12]


def test_a_json_answer_and_a_terminal_answer_first_then_the_panel_is_refused(
    server: lab.LabServer, store: Any, store_path: Any
) -> None:
    import kernelext as kx
    from kernelext._cli.approvals import answer_command

    asking("answered-in-terminal", [])
    (question,) = kx.questions("answered-in-terminal")
    args = argparse.Namespace(
        run_id="answered-in-terminal", value="7", key=None, note=None, json=False
    )
    assert answer_command(args, store) == 0
    body = {
        "run_id": "answered-in-terminal",
        "store": str(store_path),
        "key": str(question.key),
        "answer": 8,  # a JSON value, not typed text
    }
    status, answer = post(server, "answer", body)
    assert status == 409 and answer["route"] == "kernelext"
    assert f"already answered by {kx_actor()}" in answer["message"]
    (row,) = question_rows(store, "answered-in-terminal")
    assert row["answer"] == "7"  # the terminal's answer is kept


def kx_actor() -> str:
    from kernelext._store import actor

    return actor()


def test_the_route_lists_answer(server: lab.LabServer) -> None:
    assert "answer" in server.api("/kernelext/api/status")["actions"]
