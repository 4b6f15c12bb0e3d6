"""A kernelext error in JupyterLab: the cell shows the message, not kernelext's frames.

Real JupyterLab in Debian's Chromium (the harness of tests/browser/test_browser.py); screenshots
go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import kernelext
from browser import jupyterlab as lab
from browser.harness import lab_root, opened_in_lab, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]


RESUME_TYPO = "import kernelext as kx\nkx.resume('no-such-run')"
# kernelext's own files, as a traceback would name them (.../kernelext/_core/lifecycle/control.py)
INTERNAL_PATH = os.path.dirname(os.path.abspath(kernelext.__file__)) + os.sep + "_"


def _run_failing_cell(browser_page: Any, index: int) -> Any:
    """Run cell ``index`` (it is meant to raise) and wait until it ran."""
    from playwright.sync_api import expect

    target = lab.select_cell(browser_page, index)
    browser_page.keyboard.press("Control+Enter")
    prompt = target.locator(".jp-InputPrompt")
    expect(prompt).to_have_text(lab.PROMPT_DONE, timeout=lab.WAIT_MS)
    return target


def test_resume_typo_in_jupyterlab_shows_the_message_without_kernelext_frames(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    root = lab_root(tmp_path)
    name = write_notebook(root, "errors.ipynb", [RESUME_TYPO])
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        shot("opened")
        failed = _run_failing_cell(page, 0)
        error = failed.locator(".jp-OutputArea-output[data-mime-type*='stderr']")
        error.first.wait_for(timeout=lab.WAIT_MS)
        shot("error-shown")
        text = lab.output_text(failed)
        assert "RunNotFound" in text and "No run 'no-such-run'" in text, text
        assert "kx.resume('no-such-run')" in text, text  # the user's own line stays
        assert INTERNAL_PATH not in text, text
        assert "kernelext/_" not in text, text
