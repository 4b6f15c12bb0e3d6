"""A question's card as a widget model: its out-of-band answer box (``AnswerButtons``), the
kernel's fallback for a click the server could not take, and what it says once the
question was answered elsewhere (a terminal)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

import kernelext as kx
from kernelext._core.lifecycle.from_elsewhere import store_address
from kernelext._formatting import moment_text
from kernelext._store import actor
from kernelext.widgets._questions import QuestionCard
from kernelext.widgets._stop_buttons import AnswerButtons

WAIT = 60


def asked(run_id: str, schema: Any, default: Any = None) -> tuple[Any, list[Any]]:
    seen: list[Any] = []

    @kx.agent(name=f"card-{run_id}")
    def asks(run: kx.Run) -> None:
        seen.append(run.ask("Go on?", schema=schema, default=default))

    handle = asks.start(run_id=run_id)
    assert handle.wait(WAIT) == "suspended"
    return handle, seen


@pytest.mark.parametrize(
    ("schema", "default", "choices", "typed", "multiline"),
    [
        (int, 3, [], "3", False),
        (["red", 7], 7, ["red", "7"], "7", False),
        (bool, False, ["false", "true"], "false", False),
        ({"type": "object"}, {"a": 1}, [], '{"a": 1}', True),
        (str, None, [], "", False),
    ],
)
def test_the_shown_answer_box_is_an_out_of_band_widget_fit_for_the_schema(
    store: Any, schema: Any, default: Any, choices: list[str], typed: str, multiline: bool
) -> None:
    asked("box", schema, default)
    (question,) = kx.questions("box")
    card = QuestionCard(question)
    box = card.buttons
    assert isinstance(box, AnswerButtons) and box in card.children
    assert card.answer_button not in card.children  # the in-kernel button is for code only
    assert (box.kind, box.run_id, box.key) == ("question", "box", str(question.key))
    assert box.store == store_address(store)
    assert (list(box.choices), box.typed, box.multiline) == (choices, typed, multiline)
    assert "kernelext answer box VALUE" in box.busy_hint
    assert not box.decided


def test_a_click_the_server_did_not_take_is_answered_in_the_kernel(store: Any) -> None:
    _handle, seen = asked("fallback-answer", int)
    (question,) = kx.questions("fallback-answer")
    card = QuestionCard(question)
    card.buttons._handle_message(card.buttons, {"action": "unknown"}, [])
    assert card.buttons.ack_seq == 0  # not an action of the card: ignored
    message = {"action": "answer", "answer": "five", "note": ""}
    card.buttons._handle_message(card.buttons, message, [])
    assert card.buttons.ack_seq == 1 and "must be a whole number" in card.message.value
    assert not card.buttons.decided  # refused: still open, the person tries again
    message = {"action": "answer", "answer": " 5 ", "note": "typed in the panel"}
    card.buttons._handle_message(card.buttons, message, [])
    assert card.buttons.ack_seq == 2 and card.buttons.decided
    assert card.handle is not None and card.handle.wait(WAIT) == "completed"
    assert seen == [5]
    (row,) = store.question_rows("fallback-answer")
    assert row["note"] == "typed in the panel"
    assert card.answered_text() == "answered"  # answered here, not elsewhere


def test_a_card_answered_from_a_terminal_says_who_answered_and_when(store: Any) -> None:
    from kernelext._cli.approvals import answer_command

    asked("answered-elsewhere", int)
    (question,) = kx.questions("answered-elsewhere")
    card = QuestionCard(question)
    args = argparse.Namespace(run_id="answered-elsewhere", value="9", key=None, note=None, json=0)
    assert answer_command(args, store) == 0
    card.reload()
    (row,) = store.question_rows("answered-elsewhere")
    said = f"answered elsewhere by {actor()} at {moment_text(row['answered_at'])}"
    assert said in card.header.value
    assert card.buttons.decided and card.buttons.answered_text == said
    card.answer_button.click()  # a late click in the kernel: one answer wins
    assert "already answered by" in card.message.value
    (row,) = store.question_rows("answered-elsewhere")
    assert row["answer"] == "9"
