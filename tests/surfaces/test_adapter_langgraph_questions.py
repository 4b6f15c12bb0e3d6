"""``kx.langgraph``: ``interrupt()`` as a question, against the real ``langgraph``.

``interrupt()`` suspends the run with reason ``input`` and is an open question like any
other: ``kx.questions`` lists it with the interrupt's value; ``kx.answer``, a question's
``.answer``, the panel's Answer button, ``kernelext answer`` and ``kx.langgraph.answer``
answer it, and the graph gets the answer (``Command(resume=...)``); an answered interrupt
is never asked again, and a tool call made before it is not made again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

import pytest
from support.http_server import DeliveryServer
from support.langgraph_graphs import asking_graph

import kernelext as kx
from kernelext._adapters import langgraph as kx_langgraph
from kernelext._store import Store
from kernelext.status import Reason, Status


# -- interrupt, answer (in this process) --------------------------------------------------------
class Log(TypedDict):
    log: list[str]


def test_interrupt_suspends_for_input_and_answer_resumes_without_a_second_delivery(
    store: Store, delivery_server: DeliveryServer
) -> None:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    @kx_langgraph.tool
    def notify(order: str) -> int:
        """Tell the shop an order waits for approval."""
        response = post(f"{delivery_server.url}/orders/{order}")
        return int(response)

    def approve(state: Log) -> Log:
        notify("A")  # before interrupt(): the node runs again from here after the answer
        decision = interrupt({"question": "ship order A?", "order": "A"})
        return {"log": [*state["log"], f"A:{decision}"]}

    builder = StateGraph(Log)
    builder.add_node("approve", approve)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", END)
    handle = kx_langgraph.start(builder.compile(), {"log": []}, run_id="lg-ask")
    assert handle.wait(30) == Status.SUSPENDED
    info = handle.info()
    assert info["reason"] == Reason.INPUT
    waiting = kx_langgraph.pending_interrupt("lg-ask")
    assert waiting is not None and waiting["value"] == {"question": "ship order A?", "order": "A"}
    with pytest.raises(ValueError, match="not 'nope'"):
        kx_langgraph.answer("lg-ask", "yes", interrupt_id="nope")
    resumed = kx_langgraph.answer("lg-ask", "yes")
    assert resumed is not None and resumed.wait(30) == Status.COMPLETED
    assert resumed.result == {"log": ["A:yes"]}
    assert kx_langgraph.pending_interrupt("lg-ask") is None
    with pytest.raises(kx.RunStateError, match="waits for no answer"):
        kx_langgraph.answer("lg-ask", "again")
    assert delivery_server.count(path="/orders/A") == 1  # replayed from the ledger
    kinds = [e["kind"] for e in store.events("lg-ask")]
    assert kinds.index(kx_langgraph.INTERRUPT_EVENT) < kinds.index(kx_langgraph.ANSWER_EVENT)


def test_an_interrupt_is_an_open_question_and_kx_answer_resumes_the_graph_with_it(
    store: Store,
) -> None:
    handle = kx_langgraph.start(asking_graph(), {"log": []}, run_id="lg-question")
    assert handle.wait(30) == Status.SUSPENDED and handle.info()["reason"] == Reason.INPUT
    [question] = kx.questions("lg-question")
    assert json.loads(question.prompt) == {"question": "ship order A?", "order": "A"}
    waiting = kx_langgraph.pending_interrupt("lg-question")
    assert waiting is not None and waiting["value"] == json.loads(question.prompt)
    assert question.key == kx_langgraph.interrupt_key("lg-question", waiting["id"])
    assert question.schema == {} and [q.key for q in kx.questions()] == [question.key]
    resumed = kx.answer("lg-question", "yes")
    assert resumed is not None and resumed.wait(30) == Status.COMPLETED
    assert resumed.result == {"log": ["A:yes"]}  # the graph received "yes"
    assert (
        kx.questions("lg-question") == [] and kx_langgraph.pending_interrupts("lg-question") == []
    )
    [row] = store.question_rows("lg-question")
    assert json.loads(row["answer"]) == "yes" and row["answered_at"] is not None
    timeline = [kx_langgraph.INTERRUPT_EVENT, "input_requested", "input_answered"]
    timeline.append(kx_langgraph.ANSWER_EVENT)  # the graph went on with the answer
    assert [e["kind"] for e in store.events("lg-question") if e["kind"] in timeline] == timeline


def test_each_interrupt_is_asked_once_and_answered_from_anywhere(
    store: Store, store_path: Path
) -> None:
    handle = kx_langgraph.start(asking_graph(twice=True), {"log": []}, run_id="lg-twice")
    assert handle.wait(30) == Status.SUSPENDED
    [first] = kx.questions("lg-twice")
    resumed = first.answer("yes")  # a question of kx.questions(), answered
    assert resumed is not None and resumed.wait(30) == Status.SUSPENDED  # the second interrupt
    [second] = kx.questions("lg-twice")
    assert second.key != first.key and second.prompt == "How many boxes?"
    assert second.schema == {"type": "integer", "minimum": 1}
    with pytest.raises(ValueError, match="at least 1"):
        kx.answer("lg-twice", 0)  # refused: nothing stored, the run still waits
    assert kx.resume("lg-twice").wait(30) == Status.SUSPENDED  # unanswered: it waits again
    assert [q.key for q in kx.questions("lg-twice")] == [second.key]
    done = subprocess.run(  # a terminal: typed text, read as the schema asks (an integer)
        [sys.executable, "-m", "kernelext", "answer", "lg-twice", "3", "--store", str(store_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    final = kx.resume("lg-twice")  # the answer came from another process: resume here
    assert final.wait(30) == Status.COMPLETED
    assert final.result == {"log": ["A:yes", "boxes:3"]}
    assert [json.loads(r["answer"]) for r in store.question_rows("lg-twice")] == ["yes", 3]
    asked = [e for e in store.events("lg-twice") if e["kind"] == "input_requested"]
    assert len(asked) == 2  # each interrupt asked once, never again on a later resume


def test_the_panels_question_card_answers_the_interrupt_and_resumes_the_graph(
    store: Store,
) -> None:
    from kernelext.widgets import _addons as addons
    from kernelext.widgets import _approvals as widgets
    from kernelext.widgets._panel import ControlPanel

    addons.install()
    try:
        handle = kx_langgraph.start(asking_graph(), {"log": []}, run_id="lg-panel")
        assert handle.wait(30) == Status.SUSPENDED
        panel = ControlPanel(handle)
        [box] = [a for a in panel.requests.children if isinstance(a, widgets.ApprovalsBox)]
        [card] = box.cards
        assert isinstance(card, widgets.QuestionCard) and "ship order A?" in card.header.value
        card.input.value = "yes"  # any JSON, or text
        card.answer_button.click()
        assert "resumed" in card.message.value, card.message.value
        assert panel.handle is not handle  # the panel follows the resumed run
        assert panel.handle.wait(30) == Status.COMPLETED
        assert panel.handle.result == {"log": ["A:yes"]}
        panel.detach()
    finally:
        addons.install()  # every add-on in place for the next test, whatever this one did


def post(url: str) -> int:
    from support.http_server import post_json

    return int(post_json(url, {}).body["delivery"])
