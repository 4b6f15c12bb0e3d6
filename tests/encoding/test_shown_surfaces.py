"""Surfaces that must pass the display door: kernelext's log lines and the server's,
kernelext's own errors (registered secrets masked), ``kx.sql()`` output, the question
card's and the reconcile and revalidation widgets' labels."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest

import kernelext as kx
from kernelext.errors import KernelextError

SECRET = "Zq9sEcretVal4567xyz"
ESCAPES = "\x1b[2J\x1b[31m"
FORGED = "\n[E 2026-12-06 kernelext] forged line"


@pytest.fixture
def kernelext_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("kernelext")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_log_line_shows_no_escape_code_and_forges_no_line(
    store: Any, kernelext_log: io.StringIO
) -> None:
    @kx.effect(name="probe_me" + ESCAPES + FORGED, probe=lambda key, args: None)
    def flaky(x: int) -> None:
        raise TimeoutError("slow")

    @kx.agent(name="logged")
    def logged(run: kx.Run) -> None:
        with run.step("s"):
            flaky(1)

    logged.start(run_id="lg1").wait(60)
    kx.resume("lg1").wait(60)
    out = kernelext_log.getvalue()
    assert "probe_me\\x1b[2J" in out, out  # the tool's name, escaped
    assert "\x1b" not in out and FORGED not in out
    assert all(line.startswith("kernelext") for line in out.splitlines()), out


def test_the_servers_log_lines_pass_the_door() -> None:
    """Each value a server log line holds is shown, or a number of seconds."""
    import ast
    import inspect

    from kernelext._server import handlers

    calls = [
        node
        for node in ast.walk(ast.parse(inspect.getsource(handlers)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value).endswith(".log")
    ]
    assert len(calls) >= 2
    for call in calls:
        for value in call.args[1:]:
            text = ast.unparse(value)
            assert text.startswith("shown(") or text.endswith("seconds']"), text


@pytest.fixture
def registered() -> Iterator[str]:
    kx.secrets.register(SECRET)
    try:
        yield SECRET
    finally:
        kx.secrets.forget(SECRET)


@pytest.mark.parametrize(
    "call",
    [
        lambda: kx.resume("nope-" + SECRET),
        lambda: kx.approve(SECRET),
        lambda: kx.answer("x" + SECRET, "1"),
    ],
    ids=["resume", "approve", "answer"],
)
def test_kernelexts_errors_mask_a_registered_secret(store: Any, registered: str, call: Any) -> None:
    with pytest.raises(KernelextError) as caught:
        call()
    assert registered not in str(caught.value)
    assert "***" in str(caught.value)


def test_every_shown_text_masks_a_registered_secret(registered: str) -> None:
    from kernelext._shown import shown, shown_html

    assert shown(f"token {registered}\u200b") == "token ***\\u200b"
    assert registered not in shown_html(f"<b>{registered}</b>")


# -- the question card ----------------------------------------------------------------------------
LOOKS_SAME = ["paypal", "p\u0430ypal", "pay\u202e001"]  # Latin, Cyrillic а, a bidi override


def test_the_question_cards_choices_and_default_are_shown_through_the_door(store: Any) -> None:
    from kernelext._shown import shown
    from kernelext.widgets._questions import QuestionCard, input_for

    @kx.agent(name="chooser")
    def chooser(run: kx.Run) -> None:
        run.ask("Pay whom?", schema=LOOKS_SAME, default=LOOKS_SAME[2])

    assert chooser.start(run_id="choose").wait(60) == "suspended"
    (question,) = kx.questions("choose")
    box = QuestionCard(question).buttons
    assert list(box.choices) == LOOKS_SAME  # what is sent back: the choice itself
    assert list(box.choice_labels) == [shown(c) for c in LOOKS_SAME]
    assert len(set(box.choice_labels)) == 3 and "\u202e" not in "".join(box.choice_labels)
    assert box.typed == LOOKS_SAME[2] and box.typed_label == "pay\\u202e001"
    dropdown, read = input_for({"enum": LOOKS_SAME})
    assert [label for label, _ in dropdown.options] == box.choice_labels
    dropdown.value = 1
    assert read() == LOOKS_SAME[1]


def test_the_answer_box_script_shows_labels_and_sends_the_choice_by_index() -> None:
    from pathlib import Path

    import kernelext.widgets as widgets

    script = (Path(widgets.__file__).parent / "_stop_buttons.js").read_text()
    body = script[script.index("function answerInput") : script.index("function renderQuestion")]
    assert "option.value = String(index)" in body
    assert "option.textContent = labels[index]" in body
    assert "choices[Number(input.value)]" in body
    assert 'model.get("typed_label")' in body and 'input.value = model.get("typed")' not in body


# -- the reconcile and revalidation widgets' pickers ----------------------------------------------
HIDDEN = "\u202e\u200b\x1b[31m"


class Lost(BaseException):
    """Stands for the process going away in the middle of a call."""


@kx.effect(name="ship" + HIDDEN)
def hidden_ship(order: int) -> None:
    raise Lost


@kx.agent(name="hidden-unknowns")
def hidden_unknowns(run: kx.Run) -> None:
    with run.step("ship" + HIDDEN), contextlib.suppress(Lost):
        hidden_ship(1)
    raise RuntimeError("the process went away")


def test_the_reconcile_pickers_labels_pass_the_door(store: Any) -> None:
    from kernelext.widgets._reconcile import reconcile_for_handle

    assert hidden_unknowns.start(run_id="hidden").wait(60) == "failed"
    widget = reconcile_for_handle(kx.resume("hidden"))
    assert widget is not None
    (label,) = [label for label, _ in widget.picker.options]
    assert "ship\\u202e\\u200b\\x1b[31m" in label
    assert not set("\u202e\u200b\x1b") & set(label)


def test_the_revalidation_step_picker_shows_step_names_through_the_door() -> None:
    from kernelext._formatting import step_label

    assert step_label(2, "fetch" + HIDDEN) == "step 3 (fetch\\u202e\\u200b\\x1b[31m)"
    assert not set("\u202e\u200b\x1b") & set(step_label(None, "fetch" + HIDDEN))


# -- kx.sql() and column names ---------------------------------------------------------------------
def test_kx_sql_displays_through_the_door_and_keeps_its_values(store: Any) -> None:
    import pandas as pd

    frame = kx.sql("select ? as name, 1 as n", ["bob\u202e\x1b[31m"])
    assert frame["name"][0] == "bob\u202e\x1b[31m"  # for code: the value as stored
    for shown_text in (repr(frame), frame._repr_html_()):
        assert "bob\\u202e\\x1b[31m" in shown_text
        assert "\u202e" not in shown_text and "\x1b" not in shown_text
    derived = frame.head(1)
    assert type(derived) is pd.DataFrame  # what it derives is a plain table


def test_a_column_named_0_and_one_named_the_text_0_read_differently() -> None:
    import pandas as pd

    from kernelext._shown import shown_frame

    frame = pd.DataFrame([[1, 2]], columns=pd.Index([0, "0"], dtype=object))
    seen = shown_frame(frame)  # what kx.sql(), kx.runs() and %%ledger tables display
    header = repr(seen).splitlines()[0]
    assert "0 (int)" in header and header.count("0") == 2
    assert "0 (int)" in seen._repr_html_()
    assert list(frame.columns) == [0, "0"]


# -- kernelext approvals --show / --out ------------------------------------------------------------
@kx.effect(needs_approval=True)
def upload(rows: Any) -> int:
    return 1


@kx.agent(name="uploader")
def uploader(run: kx.Run, rows: Any) -> None:
    with run.step("s"):
        upload(rows)


def test_approvals_show_aligns_shown_cells_and_out_writes_no_formula(
    store: Any, store_path: Any, tmp_path: Any
) -> None:
    import contextlib
    import csv

    import pandas as pd

    from kernelext._cli.main import main

    rows = pd.DataFrame(
        {
            "payee": ['=HYPERLINK("http://evil","alice")', "bob\u202e\u200b", "\u6771\u4eac"],
            "amount": ["=2*50", "-5", "@SUM(A1)"],
            "note": ["+A1*2", "\tx", "ok"],
        }
    )
    assert uploader.start(rows, run_id="up").wait(60) == "suspended"
    (request,) = kx.approvals("up")
    out = io.StringIO()
    target = tmp_path / "rows.csv"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        main(["approvals", "--show", str(request.id), "--store", str(store_path)])
        main(
            [
                "approvals",
                "--show",
                str(request.id),
                "--out",
                str(target),
                "--store",
                str(store_path),
            ]
        )
    table = [
        line
        for line in out.getvalue().splitlines()
        if line.lstrip().startswith(("#", "1 ", "2 ", "3 "))
    ]
    header, first, second = table[0], table[1], table[2]
    assert "bob\\u202e\\u200b" in second
    assert header.index("note") == second.index("\\tx"), out.getvalue()
    assert header.index("note") == first.index("+A1*2")
    third = table[3]  # 東京 takes four columns on a terminal
    before_ok = third[: third.index(" ok")]
    assert len(before_ok) + sum(c in "\u6771\u4eac" for c in before_ok) + 1 == header.index("note")
    with target.open(encoding="utf-8", newline="") as written_file:
        written = list(csv.reader(written_file))
    assert written[1] == ['\'=HYPERLINK("http://evil","alice")', "'=2*50", "'+A1*2"]
    assert written[2] == ["bob\u202e\u200b", "-5", "'\tx"]
    assert written[3] == ["\u6771\u4eac", "'@SUM(A1)", "ok"]  # and a number stays one


def test_a_kx_sql_table_pickles_as_one(store: Any) -> None:
    import pickle

    frame = kx.sql("select ? as name", ["bob\u202e"])
    back = pickle.loads(pickle.dumps(frame))
    assert type(back) is type(frame) and back.equals(frame)
    assert "\u202e" not in repr(back)
