"""The overview of the runs (``kx.runs()``) in real JupyterLab, clicked as a person would.

A background agent runs; ``kx.runs()`` shows its row. While the kernel sleeps in the
user's cell, the row's Stop is clicked: the click travels through the notebook server
(recorded with source ``overview``), and the row goes to stopping / suspended while the
cell still runs (the overview follows the store from the kernel's watch thread). Once the
kernel is free, the row's Panel opens the run's control panel under the table.
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
    PANEL,
    click,
    executing,
    lab_root,
    opened_in_lab,
    sleeping_until,
    start_sleeping,
    store_report,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OVERVIEW = ".kernelext-runs:not(.kernelext-static)"
GATE = "sleeper.done"  # in the notebook's folder: the test makes it after its checks


def cells(gate: Path) -> list[str]:
    return [
        "%load_ext kernelext\nimport time\nimport kernelext as kx",
        """@kx.agent(name="slow-steps")
def slow_steps(run):
    for i in run.steps(range(600), key=str):  # 5 min: running at the click, however slow
        time.sleep(0.5)""",
        'h = slow_steps.start(run_id="background")\nprint("started", h.run_id)',
        "kx.runs()",
        sleeping_until(gate),
    ]


def test_a_row_s_stop_lands_while_the_kernel_sleeps(
    tmp_path: Path,
    store_path: Path,
    page: Any,
    shots_folder: Path,
) -> None:
    root = lab_root(tmp_path)
    gate = root / GATE
    name = write_notebook(root, "runs.ipynb", cells(gate))
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        for index in range(4):
            lab.run_cell(page, index)
        overview = lab.cell(page, 3).locator(OVERVIEW)
        badge = overview.locator(".kernelext-status")
        badge.filter(has_text=re.compile(r"^running$")).wait_for()
        overview.get_by_text(re.compile(r"^\d+/600 steps$")).wait_for()
        shot("the-overview-with-a-running-run")

        sleeper = start_sleeping(page, 4)
        row = overview.locator("[data-kernelext-run='background']")
        clicked, click_t = click(lab.button(row, "Stop"))
        row.get_by_text(re.compile(r"Stop recorded \(runs overview\)")).wait_for(timeout=5_000)
        badge.filter(has_text=re.compile(r"^(stopping|suspended)$")).wait_for(timeout=5_000)
        shown_s = time.monotonic() - click_t
        badge.filter(has_text=re.compile(r"^suspended$")).wait_for(timeout=10_000)
        suspended_s = time.monotonic() - click_t
        overview.get_by_text(re.compile(r"^a resume · expires in ")).wait_for()
        assert executing(sleeper), "the run must stop while the user's cell still sleeps"
        assert lab.button(row, "Stop").is_disabled()
        shot("suspended-while-the-kernel-sleeps")
        gate.touch()  # the user's cell ends

        lab.wait_cell_done(sleeper, 60_000)
        lab.button(overview, "Panel").click()  # a kernel message: the kernel is free now
        panel = overview.locator(PANEL)
        panel.get_by_text(
            re.compile(r"suspended: stopped by you \(runs overview\)")
        ).first.wait_for()
        shot("the-run-s-panel-opened-from-its-row")
        stops, _steps = store_report(page, "background")
        assert [s for s, _ in stops] == ["overview"]
        in_store_s = (stops[0][1] - clicked).total_seconds()
    print(
        f"\noverview Stop, kernel in time.sleep: request in the store {in_store_s:.3f} s after "
        f"the click; stopping or suspended shown after {shown_s:.3f} s; suspended after "
        f"{suspended_s:.3f} s"
    )
