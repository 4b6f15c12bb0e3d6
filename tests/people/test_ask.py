"""``run.ask`` (issue 13): a question to a person, answered once, replayed on every resume.

Real runs on a real DuckDB store, a real ``%%agent`` shell, and real kernels for the
answer that outlives its kernel. Time: about 25 s (the two kernels take most of it).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from support.http_server import DeliveryServer, post_json
from support.kernels import KernelSession
from support.live import finish_live_runs, name
from support.shells import cell_shell

import kernelext as kx
from kernelext._core.people.asking import check_answer, parse_answer, schema_spec
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

WAIT = 60.0
FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "seats": {"type": "integer", "minimum": 1, "maximum": 9},
        "class": {"enum": ["economy", "business"]},
    },
    "required": ["name", "seats"],
}


# -- schemas ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "good", "bad", "why"),
    [
        (int, 3, "3", "must be a whole number; got '3' (str)"),
        (int, 4, True, "must be a whole number; got True (bool)"),
        (float, 2.5, "2.5", "must be a number"),
        (bool, False, 0, "must be true or false"),
        (str, "yes", 7, "must be text"),
        (["red", "green"], "green", "blue", 'must be one of "red", "green"; got \'blue\''),
        (FORM, {"name": "Ann", "seats": 2}, {"name": "Ann"}, "needs the field 'seats'"),
        (
            FORM,
            {"name": "Bo", "seats": 9},
            {"name": "Bo", "seats": 0},
            "'seats' must be at least 1",
        ),
        (
            FORM,
            {"name": "Cy", "seats": 1, "class": "business"},
            {"name": "Cy", "seats": 1, "class": "first"},
            "field 'class' must be one of",
        ),
    ],
)
def test_an_answer_must_fit_the_schema(schema: Any, good: Any, bad: Any, why: str) -> None:
    spec = schema_spec(schema)
    check_answer(spec, good)
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_answer(spec, bad)


def test_schemas_outside_the_small_set_are_refused_and_typed_text_is_read() -> None:
    with pytest.raises(TypeError, match="takes str, int, float, bool, a list of choices"):
        schema_spec(set)
    with pytest.raises(ValueError, match="at least one choice"):
        schema_spec([])
    assert parse_answer(schema_spec(int), " 42 ") == 42
    assert parse_answer(schema_spec(float), "2.5") == 2.5
    assert parse_answer(schema_spec(bool), "yes") is True
    assert parse_answer(schema_spec([1, 2, 3]), "2") == 2
    assert parse_answer(schema_spec(FORM), '{"name": "Di", "seats": 3}') == {
        "name": "Di",
        "seats": 3,
    }
    assert parse_answer(schema_spec(str), "  as typed ") == "  as typed "


# -- asking in a run --------------------------------------------------------------------------
def planner(server: DeliveryServer) -> Any:
    @kx.effect
    def book(seat: int, *, idempotency_key: str | None = None) -> Any:
        return post_json(server.url + "/book", {"seat": seat}, idempotency_key=idempotency_key).body

    @kx.agent(name=name("planner"))
    def plan(run: kx.Run) -> int:
        seats: int = run.ask("How many seats?", schema=int, default=2)
        for seat in run.steps(range(seats)):
            book(seat)
            if seat == 0 and not run.state.get("paused"):
                run.state["paused"] = True
                run.suspend("other")  # a later pause: the answer is replayed after it
        return seats

    return plan


def test_ask_suspends_for_input_and_the_answer_resumes_the_run_once_and_for_all(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("ask")
    assert planner(delivery_server).start(run_id=run_id).wait(WAIT) == "suspended"
    run = store.get_run(run_id)
    assert run["reason"] == "input"
    waited = run["deadline"] - run["created_at"]  # the `input` policy: 3 days from the question
    assert dt.timedelta(days=3) <= waited < dt.timedelta(days=3, minutes=5)
    [question] = kx.questions(run_id)
    assert (question.prompt, question.schema, question.default) == (
        "How many seats?",
        {"type": "integer"},
        2,
    )
    assert question.expires_at == run["deadline"]
    assert len(delivery_server.deliveries) == 0  # nothing ran past the question

    with pytest.raises(ValueError, match=r"Answer refused .* must be a whole number"):
        kx.answer(run_id, "three")
    assert store.question_rows(run_id)[0]["answer"] is None  # a refused answer is not stored

    handle = kx.answer(run_id, 3, note="the whole team")
    assert handle is not None and handle.wait(WAIT) == "suspended"  # the later pause
    with pytest.raises(kx.RunStateError, match="already answered"):
        question.answer(4)
    final = kx.resume(run_id)
    assert final.wait(WAIT) == "completed" and final.result == 3
    assert sorted(d["body"]["seat"] for d in delivery_server.deliveries) == [0, 1, 2]
    [row] = store.question_rows(run_id)
    assert (json.loads(row["answer"]), row["note"]) == (3, "the whole team")
    assert row["actor"].startswith(getpass.getuser() + "@")
    kinds = [e["kind"] for e in store.events(run_id)]
    assert kinds.count("input_requested") == 1 and kinds.count("input_answered") == 1
    table = kx.sql("SELECT prompt, answer FROM inputs WHERE run_id = ?", [run_id])
    assert table.to_dict("records") == [{"prompt": "How many seats?", "answer": "3"}]


def test_typed_text_and_the_default_answer_too(
    store: Store, delivery_server: DeliveryServer
) -> None:
    first, second = name("text"), name("default")
    plan = planner(delivery_server)
    assert plan.start(run_id=first).wait(WAIT) == "suspended"
    assert plan.start(run_id=second).wait(WAIT) == "suspended"
    assert kx.answer(first, " 1 ", text=True).wait(WAIT) == "suspended"  # 1 seat, the pause
    assert json.loads(store.question_rows(first)[0]["answer"]) == 1
    [question] = kx.questions(second)
    assert question.answer().wait(WAIT) == "suspended"  # the default: 2 seats, then the pause
    assert json.loads(store.question_rows(second)[0]["answer"]) == 2
    with pytest.raises(kx.LedgerError, match="0 open question"):
        kx.answer(first, 5)


# -- %%agent cells ------------------------------------------------------------------------
@pytest.fixture
def shell(store_path: Path) -> Iterator[InteractiveShell]:
    with cell_shell(store_path, forget=("batch", "run")) as ip:
        yield ip


def test_an_agent_cell_asks_and_its_rerun_gets_the_answer(shell: InteractiveShell) -> None:
    run_id = name("cell-ask")
    cell = f"%%agent {run_id}\nbatch = run.ask('Batch size?', schema=[10, 50, 100])\n"
    assert not shell.run_cell(cell).success  # suspended at the question
    row = runtime().settings.store().get_run(run_id)
    assert (row["status"], row["reason"]) == ("suspended", "input")
    assert kx.answer(run_id, 50) is not None  # this kernel's run: resumed
    assert shell.run_cell(cell).success
    assert shell.user_ns["batch"] == 50


# -- expiry --------------------------------------------------------------------------------
def test_an_expired_question_cannot_be_answered(store_path: Path) -> None:
    now = [dt.datetime(2031, 5, 1, 12, 0)]
    store = open_store(str(store_path), clock=lambda: now[0])
    runtime().settings.use_store(store)
    try:

        @kx.agent(name=name("late"))
        def late(run: kx.Run) -> Any:
            return run.ask("Go ahead?", schema=bool)

        run_id = name("late")
        assert late.start(run_id=run_id).wait(WAIT) == "suspended"
        [question] = kx.questions(run_id)
        now[0] = question.expires_at
        assert kx.sweep().expired_ids == [run_id]
        assert kx.questions(run_id) == []
        with pytest.raises(kx.RunStateError, match=r"expired at .* can no longer be answered"):
            question.answer(True)
    finally:
        finish_live_runs()
        runtime().settings.close()


# -- an answer outlives its kernel ---------------------------------------------------------------
AGENT = """
import kernelext as kx

@kx.agent(name="asker")
def asker(run):
    size = run.ask("How many?", schema=int)
    for i in run.steps(range(2)):
        if i == 0:
            run.suspend("other")
    return size
"""


@pytest.mark.slow
def test_the_answer_survives_a_kernel_restart(store_path: Path) -> None:
    env = {"KERNELEXT_STORE": str(store_path)}
    with KernelSession(env) as kernel:
        kernel.run(AGENT).ok()
        assert "suspended" in kernel.run("print(asker.start(run_id='ask-k').wait())").ok().text
        reply = kernel.run("h = kx.answer('ask-k', 3)\nprint(h.wait())").ok()
        assert "suspended" in reply.text  # answered, then paused at step 0 (reason other)
    with KernelSession(env) as kernel:  # a new kernel: nothing of the old one is left
        kernel.run(AGENT).ok()
        reply = kernel.run("h = kx.resume('ask-k')\nprint(h.wait(), h.result)").ok()
        assert "completed 3" in reply.text
        kernel.run("kx.open_store().close()").ok()
    store = open_store(str(store_path))
    try:
        assert len(store.question_rows("ask-k")) == 1
        kinds = [e["kind"] for e in store.events("ask-k")]
        assert kinds.count("input_requested") == 1  # asked once, never again
    finally:
        store.close()
