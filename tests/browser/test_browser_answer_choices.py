"""A question's choices in the panel's card, in real JupyterLab: each reads as the display
door shows it (two choices that look alike raw read differently), and the one picked is
stored as the choice itself, sent by its index, not as the text on screen.
Screenshots go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from browser import jupyterlab as lab
from browser.harness import (
    click,
    lab_root,
    opened_in_lab,
    run_to_panel,
    write_notebook,
)
from kernelext._shown import shown

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHOICES = ["paypal", "p\u0430ypal", "pay\u202e001"]  # Latin; a Cyrillic а; a bidi override
ASKING_CELLS = [
    "%load_ext kernelext\nimport kernelext as kx",
    f"""@kx.agent(name="asks-payee")
def asks_payee(run):
    with run.step("ask"):
        return run.ask("Pay whom?", schema={CHOICES!r})""",
    'h = asks_payee.start(run_id="payee")\nh.wait(30)\nh',
    "print('ANSWER', ascii(list(kx.sql('SELECT answer FROM questions').answer)))",
]


def test_the_cards_choices_read_as_shown_and_the_pick_is_the_choice(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = write_notebook(root, "choices.ipynb", ASKING_CELLS)
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        panel = run_to_panel(page, 3)
        card = panel.locator(".kernelext-answer-buttons")
        select = card.locator("select.kernelext-answer-input")
        labels = select.locator("option").all_inner_texts()
        assert labels == [shown(c) for c in CHOICES], labels
        assert select.locator("option").evaluate_all("os => os.map(o => o.value)") == [
            "0",
            "1",
            "2",
        ]
        select.select_option(label=shown(CHOICES[1]))
        shot("the-choices-as-shown")
        click(card.locator("button.kernelext-answer"))
        # The status itself: "completed" is also in "0 steps completed", shown while the
        # run waits for the answer, so a text search would not wait at all.
        expect(panel.locator(".kernelext-status")).to_have_text("completed", timeout=60_000)
        out = lab.output_text(lab.run_cell(page, 3))
    stored = json.dumps(CHOICES[1], ensure_ascii=False)  # the answer, as JSON text
    assert f"ANSWER {[stored]!a}" in out, out
