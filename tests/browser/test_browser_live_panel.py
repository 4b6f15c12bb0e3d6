"""The panel in real JupyterLab follows its run in the store: a stop typed in a terminal
(``kernelext stop RUN``, another process) shows in the open panel, stopping then
suspended, and its compact timeline follows; the buttons never move, the resume plan
waits collapsed under them, and the panel reads well in the light and the dark theme.

Screenshots of every state go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from browser import jupyterlab as lab
from browser.harness import PANEL, lab_root, opened_in_lab, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_ID = "live-panel"
GATE = "first-step.done"  # in the notebook's folder: the test makes it once the stop shows


def cells(gate: Path) -> list[str]:
    return [
        "%load_ext kernelext\nimport os, time\n\nimport kernelext as kx",
        f"""@kx.effect
def record(i):
    return i


@kx.agent(name="long-steps")
def long_steps(run):
    for i in run.steps(range(3)):
        record(i)
        if i == 0:  # the first step lasts until the stop is seen in the panel
            deadline = time.monotonic() + 120
            while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            time.sleep(1.5)""",
        f'h = long_steps.start(run_id="{RUN_ID}")\nh',
    ]


SMALLEST_TEXT_PX = 11.0


def terminal(*args: str, store: Path) -> str:
    """A command typed in a terminal: another process than the kernel."""
    done = subprocess.run(
        [sys.executable, "-m", "kernelext", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def smallest_text_px(panel: Any) -> float:
    """The smallest computed font size of any text shown in the panel (SVG text scaled
    with its picture)."""
    return float(
        panel.evaluate(
            """root => {
              let least = 1e9;
              const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
              while (walker.nextNode()) {
                const node = walker.currentNode;
                const el = node.parentElement;
                if (!node.textContent.trim() || !el || el.closest('style,title')) continue;
                const rect = el.getBoundingClientRect();
                if (rect.width === 0 && rect.height === 0) continue;  // not shown
                let px = parseFloat(getComputedStyle(el).fontSize);
                const svg = el.closest('svg');
                if (svg && svg.viewBox.baseVal && svg.viewBox.baseVal.width) {
                  px *= svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
                }
                least = Math.min(least, px);
              }
              return least;
            }"""
        )
    )


def switch_to_dark_theme(page: Any) -> None:
    """Settings > Theme > JupyterLab Dark, as a person would pick it."""
    page.locator(".lm-MenuBar-itemLabel").filter(has_text=re.compile(r"^Settings$")).click()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Theme$")).hover()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^JupyterLab Dark$")).click()
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    # the theme change shows JupyterLab's splash over the page until the new theme is in
    page.locator("#jupyterlab-splash").wait_for(state="detached")


def test_a_stop_from_a_terminal_shows_in_the_open_panel_and_its_timeline(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    gate = root / GATE
    name = write_notebook(root, "live_panel.ipynb", cells(gate))
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        lab.run_cell(page, 0)
        lab.run_cell(page, 1)
        panel = lab.run_cell(page, 2).locator(PANEL)
        status = panel.locator(".kernelext-status")
        header = panel.locator("svg.kx-timeline .kx-header")
        expect(status).to_have_text("running")
        expect(header).to_contain_text("· running · 1 step attempt")
        resume = lab.button(panel, "Resume")
        top = resume.bounding_box()
        assert smallest_text_px(panel) >= SMALLEST_TEXT_PX
        shot("running")

        # No cell runs from here on: the stop comes from another process.
        terminal("stop", RUN_ID, store=store_path)
        expect(status).to_have_text("stopping")
        expect(panel.locator(".kernelext-stop-pending")).to_contain_text("(cli)")
        expect(header).to_contain_text("· stopping ·")
        assert panel.locator('svg.kx-timeline [data-kind="stop_request"]').count() == 1
        shot("stopping")
        gate.touch()  # the first step ends: the stop lands at its boundary

        expect(status).to_have_text("suspended")
        expect(header).to_contain_text("· suspended ·")
        outcome = panel.locator(".kernelext-outcome")
        expect(outcome).to_contain_text("suspended: stopped by you (terminal), after 1/3")
        plan = panel.locator(".kernelext-plan-preview")
        expect(plan).to_contain_text("Resume plan: Ready")
        expect(plan.locator(".kernelext-plan")).to_be_hidden()  # collapsed under the buttons
        after = resume.bounding_box()
        assert top is not None and after is not None
        assert abs(after["y"] - top["y"]) < 1, "the buttons never move"
        assert smallest_text_px(panel) >= SMALLEST_TEXT_PX
        shot("suspended-plan-collapsed")

        resume.click()
        expect(status).to_have_text("completed")
        expect(header).to_contain_text("· completed ·")
        expect(panel.locator(".kernelext-effect-counts")).to_have_text("3 effects: 3 applied")
        shot("completed")

        switch_to_dark_theme(page)
        colour = panel.evaluate("el => getComputedStyle(el).color")
        assert colour != "rgb(31, 35, 40)", "the text follows the dark theme"
        shot("completed-dark")
