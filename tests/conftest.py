"""Shared fixtures. Keep this small, and do not import kernelext at top level."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:  # makes `support` importable
    sys.path.insert(0, str(TESTS_DIR))

from support.clients import close_clients_made  # noqa: E402
from support.http_server import DeliveryServer  # noqa: E402
from support.limit_stamps import limit_stamps  # noqa: E402, F401  (fixtures)
from support.live import finish_live_runs  # noqa: E402
from support.pool_calls import spawned_pool  # noqa: E402, F401  (fixtures)
from support.ports import closed_url  # noqa: E402, F401  (fixtures)
from support.postgres import postgres_server, postgres_url  # noqa: E402, F401  (fixtures)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules marked ``both_backends`` run every test that uses ``store_path`` (or the
    ``store`` built on it) on DuckDB and on PostgreSQL; ``duckdb_only`` keeps a test on
    DuckDB (it inspects DuckDB files, journals or side files)."""
    if "backend" not in metafunc.fixturenames:
        return
    if not metafunc.definition.get_closest_marker("both_backends"):
        return
    params: list[Any] = ["duckdb"]
    if not metafunc.definition.get_closest_marker("duckdb_only"):
        params.append(pytest.param("postgres", marks=pytest.mark.postgres))
    metafunc.parametrize("backend", params, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """``duckdb`` unless the module is marked ``both_backends`` (then both, in turn)."""
    return str(getattr(request, "param", "duckdb"))


@pytest.fixture
def store_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest
) -> Any:
    """Where this test's store lives, also exported as KERNELEXT_STORE: a fresh DuckDB
    path (not yet created), or on PostgreSQL a fresh database's URL."""
    if backend == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        monkeypatch.setenv("KERNELEXT_STORE", url)
        return url
    path = tmp_path / "store" / "kernelext.duckdb"
    path.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("KERNELEXT_STORE", str(path))
    return path


@pytest.fixture
def store(store_path: Path) -> Iterator[Any]:
    """The default store for kx.* calls, on this test's own DuckDB file. Runs still
    live at the end are stopped. Modules that need another clock or backend override it."""
    import kernelext as kx
    from kernelext._core.process.runtime import runtime

    opened = kx.open_store(str(store_path))  # a path or a postgresql:// URL
    yield opened
    finish_live_runs()
    runtime().close()


@pytest.fixture
def delivery_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DeliveryServer]:
    """A started DeliveryServer logging to tmp_path/deliveries.jsonl.

    Options via indirect parametrisation, e.g.
    ``@pytest.mark.parametrize("delivery_server", [{"dedupe": True}], indirect=True)``.
    """
    options = dict(getattr(request, "param", {}) or {})
    options.setdefault("log_path", tmp_path / "deliveries.jsonl")
    with DeliveryServer(**options) as server:
        yield server


@pytest.fixture(autouse=True)
def _secrets_of_this_test_only() -> Iterator[None]:
    """``kx.secrets`` is process-wide (as for a user): what a test registers is forgotten
    after it, so that a later test in the same worker does not meet a value another test
    registered (a random payload that happens to hold it would be refused)."""
    from kernelext._core.encoding.secrets import SECRETS

    saved = {k: copy.deepcopy(v) for k, v in vars(SECRETS).items() if k != "_lock"}
    yield
    with SECRETS._lock:
        vars(SECRETS).update(saved)


@pytest.fixture(autouse=True)
def _clients_closed() -> Iterator[None]:
    """The clients a test made with ``support.clients.closed_after`` are closed after it:
    none of their connections is left for the garbage collector to find in a later test."""
    yield
    close_clients_made()


@pytest.fixture(autouse=True)
def _panel_addons_as_imported() -> Iterator[None]:
    """Each test finds the panels' add-ons as importing kernelext.widgets installs them: a
    test that unloaded the extension (``%unload_ext kernelext`` takes them out) leaves them
    out for nobody else, whichever tests a worker runs after it."""
    yield
    addons = sys.modules.get("kernelext.widgets._addons")
    if addons is not None and not addons.installed():
        addons.install()


@pytest.fixture(autouse=True)
def _fresh_runtime() -> Iterator[None]:
    """Each test runs in a fresh kernelext runtime: default settings, no store open, no
    live runs, hooks, callbacks or caches of another test. It keeps what the test modules
    defined when they were imported (agents, kx.checks, kx.credentials, effect probes).
    Runs still live at the end are stopped before the previous runtime comes back (the
    current runtime is process-wide: their threads read it too)."""
    from kernelext._core.process.runtime import Runtime, runtime, use_runtime

    with use_runtime(Runtime(definitions_from=runtime())):
        yield
        finish_live_runs()


# How the suite is split between pytest-xdist workers (`-n $(TEST_WORKERS) --dist loadgroup`,
# see the Makefile). Tests of one xdist group run on one worker, one after another; every
# other test goes to whichever worker is free.
# - The tests of tests/browser/ (Chromium with JupyterLab) and of tests/crash/ (SIGKILL loops,
#   write faults) are heavy: each folder is one group, so two of them never overlap and
#   starve each other's waits.
# - Tests that share a module-scoped fixture (a JupyterLab server, a Dask cluster, a process
#   pool) stay on one worker, so that the fixture starts once rather than once per worker.
# - A test's folder also sets its marker: a test in crash/ or browser/ cannot forget it.
SERIAL_FOLDERS = ("browser", "crash")  # folder = its marker = its xdist group
SHARED_SCOPES = ("package", "module", "class")


def _folder(item: pytest.Item) -> str | None:
    if not item.path.is_relative_to(TESTS_DIR):
        return None
    return item.path.relative_to(TESTS_DIR).parts[0]


def _xdist_group(item: pytest.Item) -> str | None:
    folder = _folder(item)
    if folder in SERIAL_FOLDERS:
        return folder
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs.values() if fixtures else ()
    if any(defs and defs[-1].scope in SHARED_SCOPES for defs in definitions):
        return f"module-{item.path.stem}"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = _folder(item)
        if folder in SERIAL_FOLDERS and not item.get_closest_marker(folder):
            item.add_marker(getattr(pytest.mark, folder))
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = _xdist_group(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker of `--dist loadgroup` whose grouped tests lost their group: pytest-xdist
    marks a group in the test's node id (``...@browser``), which some pytest releases ignore.
    Then the groups are spread over the workers in silence; stop instead."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rsplit("]", 1)[-1]
    ]
    if lost:
        message = (
            f"--dist loadgroup has no effect with pytest {pytest.__version__} and this "
            f"pytest-xdist ({len(lost)} grouped tests lost their group, e.g. {lost[0]}). "
            "Install the versions pyproject.toml's test extra allows (`make venv`)."
        )
        sys.stderr.write(f"\n{message}\n")
        pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)
