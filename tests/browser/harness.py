"""What every browser test shares: the page and screenshot fixtures, a notebook opened in
JupyterLab with its screenshots, and the moves a person makes on a run's panel.

The ``page`` and ``shots_folder`` fixtures are in tests/browser/conftest.py; screenshots go
to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from browser import jupyterlab as lab
from browser.lab_tab import put_away
from browser.shared_lab import server_for

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
ARTIFACTS = TESTS_DIR / "artifacts" / "browser"
PANEL = ".kernelext-panel:not(.kernelext-static)"
STORE_TIMES = """import json
import kernelext as kx
rows = kx.sql(
    "SELECT source, occurred_at FROM events WHERE run_id = $r AND kind = 'stop_requested'"
    " ORDER BY id",
    params={{"r": "{run}"}},
)
steps = kx.sql(
    "SELECT key, status FROM steps WHERE run_id = $r ORDER BY ordinal", params={{"r": "{run}"}}
)
print("STOPS", json.dumps([(s, t.isoformat()) for s, t in zip(rows.source, rows.occurred_at)]))
print("STEPS", json.dumps(list(zip(steps.key, steps.status))))"""


class Shots:
    """Numbered screenshots in tests/artifacts/browser/<test name>/.

    Used as a context manager around the browser steps: when a step fails, the
    page as it was and the JupyterLab server log are saved next to the screenshots.
    """

    def __init__(self, page: Any, folder: Path, server: lab.LabServer) -> None:
        self.page, self.folder, self.server, self.count = page, folder, server, 0

    def __call__(self, state: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{state}.png"
        self.page.screenshot(path=str(path))
        return path

    def __enter__(self) -> Shots:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            return
        with contextlib.suppress(Exception):  # keep the test's own error
            self("failure")
        with contextlib.suppress(OSError):
            shutil.copy(self.server.log_path, self.folder / "jupyterlab.log")


def lab_root(tmp_path: Path) -> Path:
    """The folder JupyterLab serves (its Jupyter home is next to it, in ``tmp_path``)."""
    root = tmp_path / "root"
    root.mkdir()
    return root


@contextlib.contextmanager
def opened_in_lab(
    page: Any,
    shots_folder: Path,
    root: Path,
    name: str,
    env: Mapping[str, str],
    opener: Callable[[Any, lab.LabServer, str], None] = lab.open_notebook,
) -> Iterator[tuple[lab.LabServer, Shots]]:
    """JupyterLab serving ``root`` with ``env`` for its kernels (the worker's shared server,
    see ``shared_lab``), notebook ``name`` open in ``page`` (kernel idle); screenshots (and,
    on a failure, the server log) kept. The test's kernels are gone once this exits."""
    with server_for(root, env) as server, Shots(page, shots_folder, server) as shot:
        opener(page, server, name)
        yield server, shot
        put_away(page, server)  # passed: its documents closed before its kernels end


def write_notebook(root: Path, name: str, sources: list[str]) -> str:
    """A notebook of code cells, one for each source, never run."""
    cells = [
        {"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
        for src in sources
    ]
    body = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / name).write_text(json.dumps(body), encoding="utf-8")
    return name


def run_to_panel(page: Any, count: int) -> Any:
    """Run the first ``count`` cells in turn; the live panel the last of them shows."""
    for index in range(count):
        lab.run_cell(page, index)
    return lab.cell(page, count - 1).locator(PANEL)


def sleeping_until(gate: Path) -> str:
    """A cell that prints "sleeping" and sleeps until the test creates ``gate`` (120 s at
    most): it is still running when the test checks, however slowly the page answered."""
    return (
        "import os, time\nprint('sleeping', flush=True)\n"
        "deadline = time.monotonic() + 120\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\nprint('slept')"
    )


def start_sleeping(page: Any, index: int) -> Any:
    """Start cell ``index`` (it prints "sleeping" and sleeps) and return it once asleep."""
    sleeper = lab.select_cell(page, index)
    page.keyboard.press("Control+Enter")
    output(sleeper).get_by_text("sleeping").wait_for()
    return sleeper


def run_all(page: Any) -> None:
    """Run → Run All Cells, from the menu bar as a person would."""
    page.locator(".lm-MenuBar-itemLabel").filter(has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Run All Cells$")).click()


def output(target: Any) -> Any:
    """A cell's output area (its source holds the same words as what it prints)."""
    return target.locator(".jp-OutputArea")


def executing(target: Any) -> bool:
    return (target.locator(".jp-InputPrompt").inner_text().strip()) == "[*]:"


def store_report(page: Any, run_id: str) -> tuple[list[tuple[str, dt.datetime]], list[Any]]:
    """The run's stop requests (source, time) and steps (key, status), read in a new cell."""
    out = lab.output_text(lab.add_cell_at_end(page, STORE_TIMES.format(run=run_id)))
    stops = next(line for line in out.splitlines() if line.startswith("STOPS "))
    steps = next(line for line in out.splitlines() if line.startswith("STEPS "))
    parsed = [(s, dt.datetime.fromisoformat(t)) for s, t in json.loads(stops[6:])]
    return parsed, [tuple(pair) for pair in json.loads(steps[6:])]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def click(target: Any) -> tuple[dt.datetime, float]:
    """Click ``target`` once it can be clicked; when the mouse went down (UTC, monotonic).

    Playwright first waits until the button is visible, enabled and still; that wait is
    not the person's: the moment is taken after it, just before the press."""
    target.click(trial=True)  # the actionability checks alone
    moment = (utc_now(), time.monotonic())
    target.click()
    return moment
