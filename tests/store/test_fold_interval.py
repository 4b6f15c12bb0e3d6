"""A steady stream of records folds in batches, and nothing that must see them waits.

A fold costs DuckDB about the same for 5 records as for 500, so records of the steady
stream (steps and calls) wait for the fold interval after the previous fold; a read, a
write, a stop request, a run's end waited for and a close fold at once. Here the interval
is made long, so that only those fold anything.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelext._store import Store, open_store
from kernelext._store.duckdb import fold

T0 = dt.datetime(2026, 1, 1)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A store holding run ``r``, whose steady stream folds only when made to."""
    monkeypatch.setattr(fold, "FOLD_INTERVAL", 30.0)
    opened = open_store(str(tmp_path / "s.duckdb"), clock=lambda: T0)
    opened.create_run("r", "agent")
    yield opened
    opened.close()


def _step(store: Store, n: int) -> int:
    data = {"id": uuid.uuid4(), "run_id": "r", "ordinal": n, "key": str(n), "name": None}
    seq = store.record("step_begin", {**data, "started_at": T0}, sync=True)
    assert seq is not None
    return seq


def _folded(store: Store) -> int:
    hot_path: Any = store.hot_path
    return int(hot_path.journal.folded_seq)


def _wait_folded(store: Store, seq: int) -> None:
    deadline = time.monotonic() + 10
    while _folded(store) < seq:
        assert time.monotonic() < deadline, "never folded"
        time.sleep(0.005)


def _steps(store: Store) -> int:
    return int(store.backend.read("SELECT count(*) FROM steps")[0][0])  # no fold first


def test_records_of_a_steady_stream_wait_for_the_interval_a_read_folds_them(
    store: Store,
) -> None:
    _wait_folded(store, _step(store, 0))  # the first record after a quiet spell: at once
    seq = _step(store, 1)  # within the interval after that fold: it waits
    time.sleep(0.3)
    assert _folded(store) < seq and _steps(store) == 1
    assert store.read("SELECT count(*) FROM steps")[0][0] == 2  # read-your-writes
    assert _folded(store) >= seq


def test_a_write_after_records_applies_them_before_itself(store: Store) -> None:
    _wait_folded(store, _step(store, 0))
    _step(store, 1)
    seen = store.write(lambda tx: tx.fetchone("SELECT count(*) FROM steps"))
    assert seen == (2,)


def test_a_stop_request_folds_at_once_with_what_came_before_it(store: Store) -> None:
    _wait_folded(store, _step(store, 0))
    _step(store, 1)
    store.queue_stop_request("r", source="test")()
    hot_path: Any = store.hot_path
    _wait_folded(store, hot_path.journal.last_seq)
    assert _steps(store) == 2


def test_enough_records_fold_without_waiting_for_the_interval(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fold, "FOLD_RECORDS", 5)
    _wait_folded(store, _step(store, 0))
    last = [_step(store, n) for n in range(1, 6)][-1]
    _wait_folded(store, last)
    assert _steps(store) == 6


def test_close_folds_what_waits_for_the_interval(tmp_path: Path, store: Store) -> None:
    _wait_folded(store, _step(store, 0))
    _step(store, 1)
    store.close()
    with open_store(store.location) as again:
        assert again.read("SELECT count(*) FROM steps")[0][0] == 2
