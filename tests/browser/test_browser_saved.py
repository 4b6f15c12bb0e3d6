"""A run's panel in a saved notebook, in real JupyterLab (Debian's Chromium, Playwright).

While the kernel is live only the widget shows (its static copy is hidden); after a
kernel restart the old panel gives way to the static copy, which says it is not
connected and names ``kx.panel(run_id)``; ``kx.panel`` in a new cell brings a live
panel back; after save, kernel shutdown and a page reload the static copy shows the
run's last status, with no widget error text. An unsigned (untrusted) copy of the saved
file shows the same. Screenshots in tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from support.notebooks import FINISH, gated_count

from browser import jupyterlab as lab
from browser.harness import PANEL, lab_root, opened_in_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REATTACH = '%load_ext kernelext\nimport kernelext as kx\nkx.panel("browser-saved")'
SAVED = ".kernelext-saved"
COMMAND = "kx.panel('browser-saved')"
WIDGET_ERROR = "Error displaying widget"


def write_notebook(path: Path) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(gated_count("browser-saved")),
        nbformat.v4.new_code_cell(FINISH),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(nb, path)
    return path.name


def wait_saved(path: Path, cells: int, seconds: float = 60.0) -> dict[str, Any]:
    """The notebook file on disk, once JupyterLab's save has written ``cells`` cells."""
    deadline = time.monotonic() + seconds
    while True:
        saved = dict(json.loads(path.read_text(encoding="utf-8")))
        if len(saved["cells"]) == cells or time.monotonic() > deadline:
            return saved
        time.sleep(0.2)


def save(page: Any) -> None:
    lab.select_cell(page, 0)
    page.keyboard.press("Control+s")


def assert_static_shown(page: Any, cell: Any) -> None:
    from playwright.sync_api import expect

    copy = cell.locator(SAVED)
    expect(copy).to_be_visible()
    expect(copy.locator(".kernelext-status")).to_have_text("completed")
    expect(copy).to_contain_text(COMMAND)
    expect(copy).to_contain_text("not connected to a kernel")
    widget_output = cell.locator(".jp-OutputArea-child").nth(1)  # right after the copy
    expect(widget_output).to_be_hidden()  # "Loading widget...", a model error, or gone
    # Nothing a person sees says the widget failed. The output kernelext hides may hold the
    # widget manager's "model not found" once a kernel connects (in a tab in the background
    # too, where the page still has it): hidden, as the line above checks.
    expect(cell.get_by_text(WIDGET_ERROR).filter(visible=True)).to_have_count(0)
    expect(cell.locator(PANEL)).to_be_hidden()
    expect(page.get_by_text(WIDGET_ERROR).filter(visible=True)).to_have_count(0)


def test_saved_panel_in_jupyterlab_live_restart_reattach_reopen(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = write_notebook(root / "saved_panel.ipynb")
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (server, shot):
        # 1. live: the widget shows, its static copy is in the page but hidden
        run_cell = lab.run_cell(page, 0)
        live = run_cell.locator(PANEL)
        expect(live.locator(".kernelext-status")).to_have_text("running")
        expect(run_cell.locator(SAVED)).to_have_count(1)
        expect(run_cell.locator(SAVED)).to_be_hidden()
        shot("live-running")
        lab.run_cell(page, 1)
        expect(live.locator(".kernelext-status")).to_have_text("completed")
        expect(run_cell.locator(SAVED)).to_be_hidden()
        shot("live-completed")

        # 2. kernel restart, no reload: the old panel gives way to the static copy
        lab.select_cell(page, 1)
        page.keyboard.press("0")
        page.keyboard.press("0")
        page.locator(".jp-Dialog button.jp-mod-accept").click()
        lab.wait_kernel_idle(page)
        assert_static_shown(page, run_cell)
        shot("after-restart")

        # 3. kx.panel in a new cell: a live panel again (its own copy hidden)
        again = lab.add_cell_at_end(page, REATTACH)
        expect(again.locator(PANEL).locator(".kernelext-status")).to_have_text("completed")
        expect(again.locator(SAVED)).to_be_hidden()
        expect(again.locator(".kernelext-panel.jupyter-widgets-disconnected")).to_have_count(0)
        shot("reattached")

        # 4. save, shut the kernel down, reload the page: the static copy shows
        save(page)
        saved = wait_saved(root / name, 3)
        assert len(saved["cells"]) == 3
        copies = [o for o in saved["cells"][0]["outputs"] if SAVED[1:] in str(o.get("data"))]
        assert len(copies) == 1 and "completed" in str(copies[0]["data"]), copies
        for session in server.api("/api/sessions"):
            server.api(f"/api/sessions/{session['id']}", method="DELETE", timeout=60.0)
        page.reload(wait_until="domcontentloaded")
        lab.wait_kernel_idle(page, lab.OPEN_MS)
        expect(lab.cells(page)).to_have_count(3, timeout=lab.OPEN_MS)
        assert_static_shown(page, lab.cell(page, 0))
        expect(lab.cell(page, 2).locator(SAVED)).to_be_visible()
        expect(page.locator("#jp-main-statusbar [title^='Notebook trusted']")).to_have_count(1)
        shot("reloaded-trusted")
        # 5. the same file, unsigned (not trusted here): the same static panel
        untrusted = "untrusted_copy.ipynb"
        copied = json.loads((root / name).read_text(encoding="utf-8"))
        copied["metadata"]["copied"] = True  # trust is per content: changed, not signed
        (root / untrusted).write_text(json.dumps(copied), encoding="utf-8")
        lab.open_notebook(page, server, untrusted)
        expect(page.locator(".lm-TabBar-tab.lm-mod-current")).to_contain_text([untrusted])
        expect(page.locator("#jp-main-statusbar [title^='Notebook not trusted']")).to_have_count(1)
        assert_static_shown(page, lab.cell(page, 0))
        shot("untrusted-copy")
