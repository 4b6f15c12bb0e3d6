"""An answer typed in the panel's question card lands while the kernel is busy, clicked as a
person in real JupyterLab: the click goes through the notebook server (kernelext's server
extension), the answer is in the store at once, and the run goes on with it once the
kernel is free. The click's note names the time in the browser's zone, with the zone.
Screenshots go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from browser import jupyterlab as lab
from browser.harness import (
    click,
    executing,
    lab_root,
    opened_in_lab,
    run_to_panel,
    start_sleeping,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ASKING_CELLS = [
    "%load_ext kernelext\nimport time\nimport kernelext as kx",
    """@kx.agent(name="asks-seats")
def asks_seats(run):
    with run.step("ask"):
        return run.ask("How many seats?", schema=int)""",
    'h = asks_seats.start(run_id="asked")\nh.wait(30)\nh',
    "print('sleeping', flush=True)\ntime.sleep(12)\nprint('slept')",
    "print('ANSWER', list(kx.sql('SELECT answer FROM questions').answer),"
    " list(kx.sql(\"SELECT status FROM runs WHERE id = 'asked'\").status))",
]


def test_an_answer_from_the_panel_lands_while_the_kernel_sleeps(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = write_notebook(root, "asking.ipynb", ASKING_CELLS)
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        panel = run_to_panel(page, 3)
        card = panel.locator(".kernelext-answer-buttons")
        card.locator(".kernelext-answer-input").fill("4")
        shot("the-question-card")
        sleeper = start_sleeping(page, 3)
        _clicked, click_t = click(card.locator("button.kernelext-answer"))
        # the click's note, or (once the store watch saw it) the line that replaces the card
        note = card.locator(".kernelext-click-note").get_by_text(
            re.compile(r"^Answered by .*\(\d\d:\d\d:\d\d [A-Z]")
        )
        note.or_(panel.get_by_text("The question was answered in a notebook by ")).first.wait_for(
            timeout=5_000
        )
        shown_s = time.monotonic() - click_t
        assert executing(sleeper), "the answer must land while the user's cell still sleeps"
        shot("answered-while-the-kernel-sleeps")
        lab.wait_cell_done(sleeper, 60_000)
        # The status itself: "0 steps completed" shows while the run waits for the answer.
        expect(panel.locator(".kernelext-status")).to_have_text("completed", timeout=60_000)
        out = lab.output_text(lab.run_cell(page, 4))
    print(f"\nanswer from the panel, kernel in time.sleep: shown after {shown_s:.3f} s")
    assert "ANSWER ['4'] ['completed']" in out, out
