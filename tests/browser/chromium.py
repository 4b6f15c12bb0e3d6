"""Debian's Chromium driven by Playwright: ``chromium_browser`` launches
``/usr/bin/chromium`` headless (never ``playwright install``); the tests' pages are opened
in it by ``browser.lab_tab.KeptTab``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from browser.jupyterlab import WAIT_MS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class ChromiumMissing(RuntimeError):
    pass


def chromium_problem() -> str | None:
    """Why Chromium cannot be used here (None when it can)."""
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return None
    return (
        f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium through "
        "Playwright (never `playwright install`). `make test` installs it "
        "(apt-get install -y chromium); as root you can run that yourself."
    )


@contextlib.contextmanager
def chromium_browser() -> Iterator[Any]:
    """Headless Chromium, launched once for the pages of the tests."""
    problem = chromium_problem()
    if problem:
        raise ChromiumMissing(problem)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            yield browser
        finally:
            browser.close()
