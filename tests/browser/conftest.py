"""The browser tests' fixtures: a Chromium page, and the folder of a test's screenshots."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import jupyterlab as lab
from browser.harness import ARTIFACTS


@pytest.fixture
def shots_folder(request: pytest.FixtureRequest) -> Path:
    folder = ARTIFACTS / str(request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def page() -> Iterator[Any]:
    problem = lab.chromium_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    with lab.chromium_page() as browser_page:
        yield browser_page
