"""A store closed by its user while a run of it is live: no kernelext thread dies (none
prints a traceback into the notebook), the run's end says the store was closed and what
to do, and a resume from the store opened again finishes the run. A ``%%agent`` cell that
closes the store and then passes its max_step_seconds: its overrun timer drops the event
quietly, and the cell itself says the store is closed."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from support.live import name, thread_deaths, wait_until

import kernelext as kx
from kernelext._core.encoding.names import source_hash
from kernelext._core.lifecycle import worker
from kernelext._core.lifecycle.cell_runs import forget_cell_runs, open_cell_run
from kernelext._store import Store
from kernelext.errors import StoreWriteError

pytestmark = pytest.mark.both_backends


def test_a_store_closed_under_a_live_run_kills_no_thread_and_the_run_resumes(
    store: Store, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    died = thread_deaths(monkeypatch)
    monkeypatch.setattr(worker, "RENEW_SECONDS", 0.0)  # the monitor renews the lease each tick
    renewals: list[bool] = []  # whether the store was closed when the monitor renewed
    renew = store.renew_lease

    def counted(*args: Any) -> None:
        renewals.append(store.closed)
        renew(*args)

    monkeypatch.setattr(store, "renew_lease", counted)
    entered, release = threading.Event(), threading.Event()

    @kx.agent(name=name("held"))
    def held(run: kx.Run) -> int:
        with run.step("wait"):
            entered.set()
            release.wait(30)
        return 7

    handle = held.start(run_id="closed-under", store=store)
    assert entered.wait(30)
    wait_until(lambda: len(renewals) >= 1, what="the monitor renewing the lease")
    store.close()
    wait_until(
        lambda: renewals.count(True) >= 2, what="the monitor renewing after the close", wait=15
    )
    release.set()
    handle.wait(30)
    assert died == []
    assert isinstance(handle.error, StoreWriteError)
    assert "its store was closed while it ran" in str(handle.error)
    assert "Open the store again and call kx.resume('closed-under')" in str(handle.error)

    reopened = kx.open_store(str(store_path))
    try:
        assert reopened.get_run("closed-under")["status"] == "running"
        resumed = kx.resume("closed-under", store=reopened)
        assert resumed.wait(30) == "completed"
        assert resumed.result == 7
    finally:
        reopened.close()


def test_a_store_closed_inside_a_cell_past_its_bound_kills_no_timer(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    died = thread_deaths(monkeypatch)
    cell = open_cell_run(name("cell-closed"), store=store, max_step_seconds=0.2)
    seen: list[str] = []
    cell.run.listeners.append(lambda what, _value: seen.append(what))

    def body() -> None:
        store.close()  # the user's own store.close() inside the cell
        wait_until(lambda: "overran" in seen or bool(died), what="the cell's overrun timer")

    try:
        with (
            caplog.at_level(logging.WARNING, logger="kernelext"),
            pytest.raises(RuntimeError, match="the kernelext store is closed"),
        ):
            cell.run_step("long", source_hash("long"), body, max_step_seconds=0.2)
    finally:
        forget_cell_runs()
    assert died == []
    assert "overran" in seen  # the panel still hears of the overrun
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
