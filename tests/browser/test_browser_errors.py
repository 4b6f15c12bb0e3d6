"""A kernelext error in JupyterLab: the cell shows the message, not kernelext's frames.

Real JupyterLab in Debian's Chromium (the harness of tests/browser/test_browser.py); screenshots
go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import kernelext
from browser import jupyterlab as lab
from browser.test_browser import Shots, page, shots_folder

pytestmark = [pytest.mark.browser, pytest.mark.slow]

__all__ = ["page", "shots_folder"]  # fixtures of tests/browser/test_browser.py, used here

RESUME_TYPO = "import kernelext as kx\nkx.resume('no-such-run')"
# kernelext's own files, as a traceback would name them (.../kernelext/_core/lifecycle/control.py)
INTERNAL_PATH = os.path.dirname(os.path.abspath(kernelext.__file__)) + os.sep + "_"


def _notebook(root: Path, source: str) -> str:
    cell = {"cell_type": "code", "execution_count": None, "id": "typo", "metadata": {}}
    notebook = {
        "cells": [{**cell, "outputs": [], "source": source}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "errors.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    return "errors.ipynb"


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
    root = tmp_path / "root"
    root.mkdir()
    name = _notebook(root, RESUME_TYPO)
    env = {"KERNELEXT_STORE": str(store_path)}
    with (
        lab.running_jupyterlab(root, tmp_path / "jupyter-home", env) as server,
        Shots(page, shots_folder, server) as shot,
    ):
        lab.open_notebook(page, server, name)
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
