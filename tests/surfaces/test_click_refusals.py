"""A click that cannot be recorded is refused up front with what to do (400 or 409), on
DuckDB and on PostgreSQL: a text no store keeps in any field, a button its source does not
have, a panel drawn before the run ended, an option libpq would read that the notebook
server does not allow. The store is left as it was (``from_elsewhere.act``, the route's door).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from support.shown import shown_by_a_panel

import kernelext as kx
from kernelext._core.lifecycle.from_elsewhere import act, describe_error
from kernelext._core.process.click_stores import open_for_click

pytestmark = [pytest.mark.both_backends]

BAD_TEXTS = {"nul": ("a\x00b", "NUL character"), "surrogate": ("a\ud800b", "lone surrogate")}


@pytest.fixture
def waiting(store: Any, store_path: Any) -> dict[str, Any]:
    """A run waiting for an approval and one waiting for a text answer."""

    @kx.effect(needs_approval=True)
    def pay(amount: int) -> str:
        return "paid"

    @kx.agent(name="approver")
    def approver(run: kx.Run) -> None:
        with run.step("pay"):
            pay(500)

    @kx.agent(name="asker")
    def asker(run: kx.Run) -> None:
        with run.step("ask"):
            run.ask("Which colour?", schema=str)

    assert approver.start(run_id="to-approve").wait(60) == "suspended"
    assert asker.start(run_id="to-answer").wait(60) == "suspended"
    (request,) = kx.approvals("to-approve")
    (question,) = kx.questions("to-answer")
    return {"store": str(store_path), "request": str(request.id), "key": str(question.key)}


def refusal(**click: Any) -> tuple[int, str]:
    """What a click gets, its store shown by a panel (refused for what it carries)."""
    action, store = click.pop("action"), click.pop("store")
    with tempfile.TemporaryDirectory() as shown_in:
        if isinstance(store, str) and "\x00" not in store:
            with contextlib.suppress(Exception):  # an address no panel could show
                shown_by_a_panel(Path(shown_in), store)
        with pytest.raises(Exception) as caught:
            act(action, click.pop("run_id"), store, shown_in=shown_in, **click)
    return describe_error(caught.value, "")


@pytest.mark.parametrize("bad", sorted(BAD_TEXTS))
@pytest.mark.parametrize(
    "action, field",
    [
        ("approve", "note"),
        ("reject", "request"),
        ("approve", "run_id"),
        ("answer", "value"),
        ("answer", "key"),
        ("answer", "note"),
        ("stop", "run_id"),
    ],
)
def test_a_text_no_store_keeps_is_refused_in_every_field(
    store: Any, waiting: dict[str, Any], action: str, field: str, bad: str
) -> None:
    text, said = BAD_TEXTS[bad]
    run_id = "to-answer" if action == "answer" else "to-approve"
    click: dict[str, Any] = {"action": action, "run_id": run_id, "store": waiting["store"]}
    if action in ("approve", "reject"):
        click["request"] = waiting["request"]
    if action == "answer":
        click |= {"key": waiting["key"], "value": "blue"}
    click[field] = text if field != "value" else {"colour": [text]}
    status, message = refusal(**click)
    name = "answer" if field == "value" else field
    assert status == 400, message
    assert f"The {name} holds a {said}" in message and "nothing was recorded" in message
    assert [r["decision"] for r in store.approval_rows(run_id="to-approve")] == [None]
    assert [r["answered_at"] for r in store.question_rows("to-answer")] == [None]
    assert store.get_run(run_id)["status"] == "suspended"


def test_an_answer_nested_too_deep_is_refused(store: Any, waiting: dict[str, Any]) -> None:
    value: Any = "blue"
    for _ in range(100):
        value = [value]
    click = {"action": "answer", "run_id": "to-answer", "store": waiting["store"]}
    status, message = refusal(**click, key=waiting["key"], value=value)
    assert status == 400 and "nested more than 64 levels" in message, message
    assert [r["answered_at"] for r in store.question_rows("to-answer")] == [None]


@pytest.mark.parametrize("action", ["approve", "reject", "answer"])
def test_the_overview_cannot_send_what_it_has_no_button_for(
    store: Any, waiting: dict[str, Any], action: str
) -> None:
    click: dict[str, Any] = {"action": action, "store": waiting["store"], "source": "overview"}
    if action == "answer":
        click |= {"run_id": "to-answer", "key": waiting["key"], "value": "blue"}
    else:
        click |= {"run_id": "to-approve", "request": waiting["request"]}
    status, message = refusal(**click)
    assert status == 400 and f"The runs overview has no {action} button" in message, message
    assert [r["decision"] for r in store.approval_rows(run_id="to-approve")] == [None]
    assert [r["answered_at"] for r in store.question_rows("to-answer")] == [None]


def test_a_panel_drawn_before_the_run_ended_says_it_ended(store: Any, store_path: Any) -> None:
    @kx.agent(name="short")
    def short(run: kx.Run) -> None:
        with run.step("one"):
            pass

    assert short.start(run_id="ended").wait(60) == "completed"
    epoch = int(store.get_run("ended")["owner_epoch"])
    status, message = refusal(action="stop", run_id="ended", store=str(store_path), epoch=epoch + 1)
    assert status == 409 and "has ended (completed)" in message, message
    assert "resumed or taken over" not in message


@pytest.mark.parametrize("option", ["bogus=1", "sslkeylogfile=/tmp/x", "target_session_attrs=any"])
def test_an_option_the_server_does_not_allow_is_refused(option: str, tmp_path: Path) -> None:
    """Even an address a panel showed is refused for an option the server does not allow."""
    address = f"postgresql://kx@127.0.0.1:1/db?{option}"
    with contextlib.suppress(Exception):  # libpq cannot read it: no panel could show it
        shown_by_a_panel(tmp_path, address)
    with pytest.raises(ValueError) as caught:
        open_for_click(address, shown_in=tmp_path)
    assert describe_error(caught.value, "")[0] == 400
    said = str(caught.value)
    assert any(why in said for why in ("libpq", "only with the options", "showed")), said
