"""Every demo notebook under Run → Run All Cells in real JupyterLab, with nobody clicking.

A person opens a notebook of notebooks/ and runs it whole before touching anything. The
notebooks press none of their own buttons (Stop, Resume, a decision, Restart: the person
does), so with no click every cell still runs, the run started by the notebook shows its
live panel, and no cell shows an error: no cell needs a click to have happened, nor a
variable that only a cell the person skipped would define.

The notebooks run as their headless tests run them: steps paced short
(``KERNELEXT_DEMO_STEP_SECONDS``), effects to a local delivery server, the LLM notebook
offline against its own scripted model server, the Dask notebook on a throw-away
PostgreSQL database and a LocalCluster. Screenshots go to
tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer
from support.postgres import find_postgres_bin

from browser import jupyterlab as lab
from browser.harness import (
    PANEL,
    REPO_ROOT,
    lab_root,
    opened_in_lab,
    run_all,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
POSTGRES_NOTEBOOKS = {"dask_batch"}  # a PostgreSQL store shared with worker processes
RUN_ALL_SECONDS = 180.0
ERRORS = f"{lab.NOTEBOOK} .jp-OutputArea-output[data-mime-type*='stderr']"


def code_cells(notebook: Path) -> list[int]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [i for i, c in enumerate(cells) if c["cell_type"] == "code"]


def panel_cell(notebook: Path) -> int | None:
    """The cell that starts the notebook's run and shows its panel (``h`` last), if any."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    for i, c in enumerate(cells):
        lines = "".join(c["source"]).strip().splitlines()
        if c.get("id") == "start" and lines and lines[-1].strip() == "h":
            return i
    return None


def error_outputs(page: Any) -> list[str]:
    """The text of every output that shows an error (a traceback, ``NameError: ...``)."""
    found = page.locator(ERRORS)
    texts = [str(found.nth(i).inner_text()) for i in range(found.count())]
    return [text for text in texts if lab.ERROR_MARK.search(text)]


def prompts(page: Any, indices: list[int]) -> list[str]:
    return [str(lab.cell(page, i).locator(".jp-InputPrompt").inner_text()).strip() for i in indices]


def wait_run_all_done(page: Any, indices: list[int], timeout_s: float) -> None:
    """Until every code cell ran (``[n]:``) and the kernel is idle; fails at the first
    error shown, or when cells are still queued or never ran after ``timeout_s``."""
    idle = page.locator("#jp-main-statusbar").get_by_text(lab.KERNEL_IDLE)
    deadline = time.monotonic() + timeout_s
    while True:
        errors = error_outputs(page)
        assert errors == [], "a cell failed under Run All:\n" + "\n\n".join(errors)[-3000:]
        shown = prompts(page, indices)
        if all(lab.PROMPT_DONE.match(p) for p in shown) and idle.count() > 0:
            return
        assert time.monotonic() < deadline, f"Run All did not finish: prompts {shown}"
        time.sleep(0.5)


def notebook_env(
    path: Path, store_path: Path, delivery_server: DeliveryServer, request: pytest.FixtureRequest
) -> dict[str, str]:
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": f"{delivery_server.url}/outbox",
        "KERNELEXT_DEMO_STEP_SECONDS": "0.3",
        "KERNELEXT_DEMO_OFFLINE": "1",  # llm_agent: its scripted model, never a real API
    }
    if path.stem in POSTGRES_NOTEBOOKS:
        pytest.importorskip("distributed", reason="needs Dask: pip install -e '.[dask]'")
        if find_postgres_bin() is None:
            pytest.skip(f"{path.name} needs PostgreSQL (no initdb): apt-get install postgresql")
        env["KERNELEXT_DASK_STORE"] = str(request.getfixturevalue("postgres_url"))
    return env


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=[pytest.mark.postgres] if p.stem in POSTGRES_NOTEBOOKS else [])
        for p in NOTEBOOKS
    ],
    ids=[p.stem for p in NOTEBOOKS],
)
def test_run_all_with_no_click_runs_every_cell_without_an_error(
    path: Path,
    tmp_path: Path,
    store_path: Path,
    delivery_server: DeliveryServer,
    request: pytest.FixtureRequest,
    page: Any,
    shots_folder: Path,
) -> None:
    from playwright.sync_api import expect

    env = notebook_env(path, store_path, delivery_server, request)
    root = lab_root(tmp_path)
    name = lab.copy_notebook(path, root)
    indices = code_cells(path)
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        run_all(page)
        started = time.monotonic()
        wait_run_all_done(page, indices, RUN_ALL_SECONDS)
        took = time.monotonic() - started
        start = panel_cell(path)
        if start is not None:  # the run's live panel, not only its saved copy
            panel = lab.cell(page, start).locator(PANEL)
            expect(panel).to_be_visible()
            panel.scroll_into_view_if_needed()
        shot("after-run-all")
    print(f"\n{path.name}: Run All, no click: {len(indices)} code cells ran in {took:.1f} s")
