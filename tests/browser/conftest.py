"""The browser tests' fixtures: one JupyterLab server and one Chromium for all of them (in a
pytest process), one tab kept from test to test while each leaves it as a fresh one would be
(else a fresh page), and the folder of a test's screenshots."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser.chromium import chromium_browser, chromium_problem
from browser.harness import ARTIFACTS
from browser.jupyterlab import WAIT_MS
from browser.lab_tab import OPENED, KeptTab, not_kept
from browser.shared_lab import sharing

_RAISED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Notes a test that raised (an expected failure too), for the ``page`` fixture."""
    yield
    if call.excinfo is not None and call.when in ("setup", "call"):
        item.stash[_RAISED] = True


@pytest.fixture(scope="package", autouse=True)
def _one_jupyterlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' notebooks are opened in one JupyterLab (started when a test first needs
    it), serving the folder every ``tmp_path`` is in; see browser/shared_lab.py."""
    home = tmp_path_factory.mktemp("shared-jupyter-home")
    with sharing(tmp_path_factory.getbasetemp(), home):
        yield


@pytest.fixture
def shots_folder(request: pytest.FixtureRequest) -> Path:
    folder = ARTIFACTS / str(request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="package")
def one_chromium() -> Iterator[Any]:
    """One headless Chromium for the tests; each test gets a page in a fresh context."""
    with chromium_browser() as browser:
        yield browser


@pytest.fixture(scope="package")
def kept_tab(one_chromium: Any) -> Iterator[KeptTab]:
    """The tab a test's page is: the previous test's when it put it away as a fresh one
    (browser/lab_tab.py), else a new one in a fresh context."""
    tab = KeptTab(one_chromium)
    yield tab
    tab.close()
    print(f"\nbrowser tests' first notebooks: {OPENED}")  # shown with -s


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Any]:
    problem = chromium_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    tab: KeptTab = request.getfixturevalue("kept_tab")
    with tab.page(WAIT_MS) as browser_page:
        yield browser_page
        if request.node.stash.get(_RAISED, False):  # even after its notebook was put away
            not_kept(browser_page)
