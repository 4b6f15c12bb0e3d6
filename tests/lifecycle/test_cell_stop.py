"""Stopping a ``%%agent`` run records the stop and does not open the run.

A stop from ``kx.stop``, ``%agent stop``, the panel or ``kernelext stop`` goes through
``control.stop``: for a cell run this process does not execute, the request is written to
the run's row and nothing else happens here: the run is not loaded, not taken over, and
its facts are not re-checked (its owner honours the stop before its next cell);
``kernelext stop RUN --wait`` then only reads the run's status from the store. Real
DuckDB store; the other process is the test's parent process (alive, so its run is never
adopted).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kernelext as kx
from kernelext._core.encoding.names import source_hash
from kernelext._core.lifecycle.cell_runs import forget_cell_runs, open_cell_run
from kernelext._core.process.runtime import runtime
from kernelext._store import Store
from kernelext._store.base import process_start

CHECKED: list[str] = []


def price_of(sku: str) -> float:
    CHECKED.append(sku)
    return 99.0  # the world moved on: a re-check of the recorded 10.0 would fail


@pytest.fixture
def price_check() -> Any:
    kx.checks.register("stop_price_of", price_of)
    CHECKED.clear()
    yield
    kx.checks.unregister("stop_price_of")
    forget_cell_runs()


def other_live_process() -> str:
    """The owner string of a process that is alive and is not this one (the parent)."""
    pid = os.getppid()
    start = process_start(pid)
    return f"{getpass.getuser()}@{socket.gethostname()}:{pid}" + (
        f".{start}" if start is not None else ""
    )


def a_cell_run_of_another_kernel(store: Store, run_id: str) -> None:
    """A cell run with one completed cell that recorded a checked fact, then held by
    another live process (this process forgets it, as a kernel that never ran it)."""
    cell = open_cell_run(run_id, store=store)

    def body() -> None:
        cell.run.facade.fact("price:A", 10.0, check=price_of, args=("A",))

    assert cell.run_step("quote", source_hash("quote"), body).kind == "completed"
    forget_cell_runs(run_id)
    store.update_run(run_id, owner=other_live_process())
    CHECKED.clear()


# The command line in a process of its own, with open_cell_run and take_over recording any
# call (to the file named by OPENED) before doing what they do.
CLI_WATCHING_OPENS = """
import json, os, sys
import kernelext._core.lifecycle.cell_runs as cell_runs

def recording(name, real):
    def call(*args, **kwargs):
        with open(os.environ["OPENED"], "a") as out:
            out.write(name + "\\n")
        return real(*args, **kwargs)
    return call

cell_runs.open_cell_run = recording("open_cell_run", cell_runs.open_cell_run)
cell_runs.take_over = recording("take_over", cell_runs.take_over)
from kernelext._cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def kinds(store: Store, run_id: str) -> list[str]:
    return [str(e["kind"]) for e in store.events(run_id)]


@pytest.mark.usefixtures("price_check")
def test_stopping_another_kernels_cell_run_records_the_stop_and_opens_nothing(
    store: Store,
) -> None:
    run_id = "cells-held-elsewhere"
    a_cell_run_of_another_kernel(store, run_id)
    before = kinds(store, run_id)

    assert kx.stop(run_id, source="test") == "stopping"

    row = store.get_run(run_id)
    assert (row["status"], row["stop_source"]) == ("stopping", "test")
    assert row["owner"] == other_live_process()  # not taken over
    assert kinds(store, run_id)[len(before) :] == ["stop_requested"]  # the stop, nothing else
    assert CHECKED == []  # no fact was re-checked
    assert (store.location, run_id) not in runtime().cell_runs  # not opened here


@pytest.mark.usefixtures("price_check")
def test_a_cell_run_this_process_executes_still_suspends_at_once(store: Store) -> None:
    run_id = "cells-here"
    cell = open_cell_run(run_id, store=store)
    assert cell.run_step("quote", source_hash("quote"), lambda: None).kind == "completed"

    assert kx.stop(run_id, source="test") == "suspended"
    assert kinds(store, run_id)[-2:] == ["stop_requested", "suspended"]
    assert CHECKED == []


@pytest.mark.usefixtures("price_check")
def test_the_command_lines_stop_wait_reads_the_status_and_opens_nothing(
    store: Store, store_path: Path, tmp_path: Path
) -> None:
    run_id = "cells-stopped-from-a-shell"
    a_cell_run_of_another_kernel(store, run_id)
    before = kinds(store, run_id)
    runtime().close()  # the command line opens the store file itself
    opened = tmp_path / "opened.txt"
    opened.touch()

    command = ["--store", str(store_path), "stop", run_id, "--wait", "--timeout", "0.5"]
    done = subprocess.run(
        [sys.executable, "-c", CLI_WATCHING_OPENS, *command, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENED": str(opened)},
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "stopping"  # its owner has not honoured it yet
    assert opened.read_text() == ""  # the run was neither opened nor taken over
    store = kx.open_store(str(store_path))
    row = store.get_run(run_id)
    assert (row["status"], row["owner"]) == ("stopping", other_live_process())
    assert kinds(store, run_id)[len(before) :] == ["stop_requested"]
    assert CHECKED == []


def test_a_stop_that_lands_after_a_cell_is_attributed_to_whoever_asked(store: Store) -> None:
    """A stop pressed in the panel while a ``%%agent`` cell runs: the suspension at the
    boundary after the cell names the panel, as the request did (never ``api``)."""
    run_id = "cells-stopped-from-the-panel"
    cell = open_cell_run(run_id, store=store)
    try:

        def body() -> None:  # the panel's click arrives while the cell runs
            store.request_stop(run_id, source="panel")

        assert cell.run_step("long", source_hash("long"), body).kind == "completed"
        assert store.get_run(run_id)["status"] == "suspended"
        events = [(str(e["kind"]), e["source"]) for e in store.events(run_id)]
        assert events[-2:] == [("stop_requested", "panel"), ("suspended", "panel")]
    finally:
        forget_cell_runs(run_id)
