"""Runs the store conformance suite (tests/conformance/store_suite.py) on every backend.

Adding a backend is one entry in ``BACKENDS``: a name, the marks its tests need, and
a function ``(request, tmp_path) -> StoreFactory``. For PostgreSQL, for example::

    class PostgresFactory(StoreFactory):
        def __init__(self, url: str) -> None: ...        # a server from a fixture
        def fresh_location(self) -> str: ...             # a new, empty database URL
        def open_location(self, location, clock): return open_store(location, clock=...)

    BACKENDS["postgres"] = Backend(
        lambda request, tmp_path: PostgresFactory(request.getfixturevalue("postgres_url")),
        marks=(pytest.mark.postgres,),
    )
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from conformance.store_suite import *  # noqa: F403  (the suite's Test* classes run here)
from conformance.store_suite import Clock, StoreFactory
from support.postgres import PostgresServer

from kernelext._store import Store, open_store, utcnow

__all__ = ["BACKENDS"]


class DuckDBFactory(StoreFactory):
    """A new DuckDB file under the test's tmp_path for every fresh store."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self._numbers = itertools.count()

    def fresh_location(self) -> str:
        return str(self.folder / f"store-{next(self._numbers)}.duckdb")

    def open_location(self, location: str, clock: Clock | None) -> Store:
        return open_store(location, clock=clock or utcnow)


class Backend(NamedTuple):
    make: Callable[[pytest.FixtureRequest, Path], StoreFactory]
    marks: tuple[pytest.MarkDecorator, ...] = ()


class PostgresFactory(StoreFactory):
    """A new, empty database on the session's real PostgreSQL server per fresh store."""

    def __init__(self, server: PostgresServer) -> None:
        super().__init__()
        self.server = server
        self.databases: list[str] = []

    def fresh_location(self) -> str:
        url = self.server.create_database()
        self.databases.append(url)
        return url

    def open_location(self, location: str, clock: Clock | None) -> Store:
        return open_store(location, clock=clock or utcnow)

    def close_all(self) -> None:
        super().close_all()
        for url in self.databases:
            self.server.drop_database(url)


BACKENDS: dict[str, Backend] = {
    "duckdb": Backend(lambda request, tmp_path: DuckDBFactory(tmp_path)),
    "postgres": Backend(
        lambda request, tmp_path: PostgresFactory(request.getfixturevalue("postgres_server")),
        marks=(pytest.mark.postgres,),
    ),
}


@pytest.fixture(params=[pytest.param(name, marks=b.marks, id=name) for name, b in BACKENDS.items()])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = BACKENDS[request.param].make(request, tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()
