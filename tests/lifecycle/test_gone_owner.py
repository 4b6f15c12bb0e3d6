"""A run whose process was killed (SIGKILL): the overview, the panel and the notebook
server's route say its process is gone, and a stop of it lands at once.

A real owner process executes a long agent run in a real store (DuckDB, PostgreSQL); it
is killed with SIGKILL inside a step (or inside a recorded call), and its lease lapses
(1.5 s in that process). A real Jupyter server with kernelext's extension takes the stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from browser import jupyterlab as lab
from support.route import module_lab_server, post  # noqa: F401  (the fixture `server`)

import kernelext as kx
from kernelext._core.lifecycle import control
from kernelext._core.lifecycle.overview import read_overview
from kernelext._core.process.lease import owner_gone

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

OWNER = textwrap.dedent(
    """
    import sys, time
    import kernelext as kx
    import kernelext._core.process.lease as lease

    lease.LEASE_SECONDS = 1.5  # lapses soon after the kill (renewed every 10 s)
    kx.configure(store=sys.argv[1])

    @kx.effect
    def slow_call(i):
        print("in call", flush=True)
        time.sleep(600)

    @kx.agent(name="long")
    def long(run):
        for i in run.steps(range(600), key=str):
            if i == 28 and sys.argv[3] == "call":
                slow_call(i)
            elif i == 28:
                print("in step", flush=True)
                time.sleep(600)
            time.sleep(0.02)

    h = long.start(run_id=sys.argv[2])
    print("status", h.wait(600), flush=True)
    """
)


@pytest.fixture
def killed(store_path: Any) -> Iterator[Callable[[str, str], str]]:
    """Start the run in another process, SIGKILL it inside step 29 (``where``: ``step``,
    or ``call``: inside a recorded call) and wait until its owner is gone; the store's
    address."""
    processes: list[subprocess.Popen[str]] = []
    path = str(store_path)

    def kill(run_id: str, where: str) -> str:
        process = subprocess.Popen(
            [sys.executable, "-c", OWNER, path, run_id, where],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        assert process.stdout is not None
        assert process.stdout.readline().strip() == f"in {where}", process.stderr
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
        deadline = time.monotonic() + 30
        while True:
            store = kx.open_store(path)
            try:
                if owner_gone(store.get_run(run_id), store.now()):
                    return path
            finally:
                store.close()
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.2)

    yield kill
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def test_the_overview_and_the_panel_say_the_process_is_gone(
    killed: Callable[[str, str], str],
) -> None:
    from kernelext.widgets._render import view_of

    path = killed("orphan", "step")
    store = kx.open_store(path)
    try:
        [row] = read_overview(store).rows
        assert row.status == "running" and row.progress == "28/600 steps", row
        assert row.time_left == "", row  # nobody executes it: no estimate
        assert row.gone.startswith("running, but its process is gone (last heard "), row
        assert "kx.resume('orphan') or stop it here" in row.gone, row
        assert row.gone in row.text()
        view = view_of(control.handle_for("orphan", store=store))
        assert view.outcome_text() == row.gone
    finally:
        store.close()


def _store_row(path: str, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    store = kx.open_store(path)
    try:
        return store.get_run(run_id), store.events(run_id)
    finally:
        store.close()


def test_a_stop_of_a_run_whose_process_is_gone_suspends_it_at_once(
    server: lab.LabServer, killed: Callable[[str, str], str]
) -> None:
    path = killed("orphan", "step")
    before, _ = _store_row(path, "orphan")
    click = {"run_id": "orphan", "store": path, "epoch": before["owner_epoch"]}
    status, answer = post(server, "stop", click)
    assert status == 200, answer
    assert answer["status"] == "suspended", answer
    message = answer["message"]
    assert "the process that ran orphan is gone (last heard " in message, message
    assert "kx.resume('orphan')" in message and "next safe point" not in message, message
    row, events = _store_row(path, "orphan")
    assert row["status"] == "suspended" and row["reason"] == "user_stop", row
    assert row["owner_epoch"] == before["owner_epoch"] + 1  # the dead owner is fenced
    last = events[-1]
    assert (last["kind"], last["source"], last["to_status"]) == ("suspended", "panel", "suspended")
    # A second click says there is nothing to stop; nothing is left "stopping".
    status, again = post(server, "stop", {"run_id": "orphan", "store": path})
    assert status == 200 and "nothing to stop" in again["message"], again


def test_a_call_the_dead_process_left_in_flight_becomes_unknown(
    server: lab.LabServer, killed: Callable[[str, str], str]
) -> None:
    path = killed("in-flight", "call")
    status, answer = post(server, "force", {"run_id": "in-flight", "store": path})
    assert status == 200 and answer["status"] == "needs_decision", answer
    assert "kx.reconcile('in-flight')" in answer["message"], answer
    store = kx.open_store(path)
    try:
        effects = list(store.load_effects("in-flight").values())
        assert [(e["tool"], str(e["status"])) for e in effects] == [("slow_call", "unknown")]
        assert store.get_run("in-flight")["status"] == "needs_decision"
    finally:
        store.close()
