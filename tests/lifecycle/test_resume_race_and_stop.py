"""Issue #10, the durable write path: one resume wins, and a stop never waits for the store.

Deliveries are counted on the real local HTTP server (tests/support/http_server.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json

import kernelext as kx
from kernelext._core.lifecycle.cell_runs import open_cell_run, stop_cell_run
from kernelext._core.lifecycle.run import engine_of
from kernelext._store import Store, open_store
from kernelext._store.duckdb.bulk import apply_records
from kernelext._store.duckdb.handoff import HandoffLock
from kernelext._store.records import check_record

WAIT = 60.0
ITEMS = 15
TRIALS = 20


def kinds(store: Store, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in store.events(run_id) if e["kind"] == kind]


# -- 1. two threads resume one run: exactly one wins ----------------------------------------
@kx.effect
def deliver(url: str, run_id: str, item: int, *, idempotency_key: str | None = None) -> int:
    body = {"run": run_id, "item": item}
    return post_json(url + "/deliver", body, idempotency_key=idempotency_key).status


class Pause:
    """Holds a fresh run in its third step until the test has asked it to stop."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()


PAUSES: dict[str, Pause] = {}
HOLDS: dict[str, threading.Event] = {}


@kx.agent(name="resume-race")
def racer(run: kx.Run, url: str, n: int) -> None:
    for i in run.steps(range(n)):
        deliver(url, run.id, i)
        run.state["done"] = run.state.get("done", 0) + 1
        if i == 2:  # completed before the stop, so a resume skips it (and never waits here)
            pause = PAUSES[run.id]
            pause.reached.set()
            pause.go.wait(WAIT)
        if i == n - 1 and run.id in HOLDS:  # the resumed run stays live until released
            HOLDS[run.id].wait(WAIT)


def suspended_run(server: DeliveryServer, trial: int) -> str:
    """A fresh run of ``racer``, suspended by a stop after three of its steps."""
    run_id = f"race-{trial}-{uuid.uuid4().hex[:6]}"
    pause = PAUSES[run_id] = Pause()
    handle = racer.start(server.url, ITEMS, run_id=run_id)
    assert pause.reached.wait(WAIT)
    assert handle.stop(source="test") == "stopping"
    pause.go.set()
    assert handle.wait(WAIT) == "suspended"
    return run_id


def race(run_id: str) -> tuple[list[kx.Handle], list[BaseException]]:
    """Two threads released at one instant both call ``kx.resume(run_id)``."""
    barrier = threading.Barrier(2)
    handles: list[kx.Handle] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def resume() -> None:
        barrier.wait(WAIT)
        try:
            handle = kx.resume(run_id)
        except BaseException as exc:
            with lock:
                errors.append(exc)
            return
        with lock:
            handles.append(handle)

    threads = [threading.Thread(target=resume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    return handles, errors


def test_two_threads_resuming_one_run_get_one_winner(
    store: Store, delivery_server: DeliveryServer
) -> None:
    for trial in range(TRIALS):
        run_id = suspended_run(delivery_server, trial)
        handles, errors = race(run_id)
        finals = [h.wait(WAIT) for h in handles]  # every worker ends before the asserts
        assert len(handles) == 1, f"trial {trial}: {len(handles)} resumes won"
        assert len(errors) == 1 and isinstance(errors[0], kx.RunStateError), errors
        assert "already" in str(errors[0]) and run_id in str(errors[0])
        assert finals == ["completed"]
        assert len(kinds(store, run_id, "resumed")) == 1
        assert store.get_run(run_id)["completed_steps"] == ITEMS
        assert handles[0].run.state == {"done": ITEMS}
    delivered = Counter(
        (d["body"]["run"], d["body"]["item"]) for d in list(delivery_server.deliveries)
    )
    assert len(delivered) == TRIALS * ITEMS
    assert set(delivered.values()) == {1}, [k for k, n in delivered.items() if n > 1]


def test_a_resume_after_the_winner_is_refused_while_the_run_executes(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = suspended_run(delivery_server, 0)
    PAUSES[run_id] = pause = Pause()
    HOLDS[run_id] = hold = threading.Event()
    first = kx.resume(run_id)
    with pytest.raises(kx.RunStateError, match="already executing in this process"):
        kx.resume(run_id)
    hold.set()
    assert first.wait(WAIT) == "completed"
    with pytest.raises(kx.RunStateError, match="already completed"):
        kx.resume(run_id)
    assert not pause.reached.is_set()
    assert len(kinds(store, run_id, "resumed")) == 1


def test_two_threads_resuming_one_cell_run_get_one_winner(store: Store) -> None:
    for trial in range(5):
        run_id = f"cells-{trial}-{uuid.uuid4().hex[:6]}"
        open_cell_run(run_id, store=store)
        assert stop_cell_run(run_id, source="test", store=store) == "suspended"
        handles, errors = race(run_id)
        assert len(handles) == 1, f"trial {trial}: {len(handles)} resumes won"
        assert len(errors) == 1 and isinstance(errors[0], kx.RunStateError), errors
        assert "already" in str(errors[0])
        assert store.get_run(run_id)["status"] == "running"
        assert len(kinds(store, run_id, "resumed")) == 1


# -- 2. a stop from the owning process never waits for the store -------------------------------
def stop_record(run_id: str, source: str, at: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "source": source,
        "who": "bob@lab:7",
        "reason": None,
        "at": at,
        "request": uuid.uuid4().hex,
    }


def test_a_stop_request_record_is_applied_once_even_when_folded_twice(store: Store) -> None:
    assert store.create_run("r1", "agent")
    first = stop_record("r1", "button", store.now())
    check_record("stop_request", first)
    for _ in range(2):  # a journal folded again after a crash
        store.write(lambda tx: apply_records(tx, [(1, "stop_request", first)]))
    row = store.get_run("r1")
    assert (row["status"], row["stop_source"]) == ("stopping", "button")
    assert row["stop_requested_at"] == first["at"]
    (event,) = kinds(store, "r1", "stop_requested")
    assert (event["from_status"], event["to_status"]) == ("running", "stopping")
    assert (event["source"], event["actor"], event["occurred_at"]) == (
        "button",
        "bob@lab:7",
        first["at"],
    )

    store.transition("r1", "suspended", ("stopping",))
    late = stop_record("r1", "api", store.now())
    for _ in range(2):
        store.write(lambda tx: apply_records(tx, [(2, "stop_request", late)]))
    assert store.get_run("r1")["status"] == "suspended"
    stops = kinds(store, "r1", "stop_requested")
    assert [(e["source"], e["to_status"]) for e in stops] == [("button", "stopping"), ("api", None)]
    assert stops[1]["reason"] == "run already suspended"
    with pytest.raises(ValueError, match="request"):
        check_record("stop_request", {**late, "request": None})


def test_a_queued_stop_request_moves_the_run_once_it_is_folded(store: Store) -> None:
    assert store.create_run("r2", "agent")
    assert store.hot_path is not None  # DuckDB: the request goes through the journal
    store.queue_stop_request("r2", source="button")()
    store.queue_stop_request("r2", source="api")()
    row = store.get_run("r2")  # a read waits for this process's journal to be folded
    assert (row["status"], row["stop_source"]) == ("stopping", "button")
    stops = kinds(store, "r2", "stop_requested")
    assert [(e["source"], e["to_status"]) for e in stops] == [
        ("button", "stopping"),
        ("api", None),
    ]
    assert stops[1]["reason"] == "run already stopping"


def test_a_stop_request_on_postgres_commits_directly_and_once(postgres_url: str) -> None:
    pg = open_store(postgres_url)
    try:
        assert pg.hot_path is None and pg.create_run("r3", "agent")
        pg.queue_stop_request("r3", source="button")()
        again = stop_record("r3", "api", pg.now())
        for _ in range(2):
            pg.record("stop_request", again, sync=True)
        row = pg.get_run("r3")
        assert (row["status"], row["stop_source"]) == ("stopping", "button")
        stops = kinds(pg, "r3", "stop_requested")
        assert [(e["source"], e["to_status"]) for e in stops] == [
            ("button", "stopping"),
            ("api", None),
        ]
    finally:
        pg.close()


# Holds the store file in another process: the query runs under the connection's lock, which
# is taken before "started" is printed, so from then until "done" the file is not handed over.
HOLDER = """
import sys
import kernelext as kx

store = kx.open_store(sys.argv[1])
with store.backend._mutex:
    store.backend.read("SELECT 1")  # the file is open here, and stays so until the query ends
    print("started", flush=True)
    kx.sql(sys.argv[2], store=store)
print("done", flush=True)
store.close()
"""
LONG_QUERY = (
    "SELECT count(*) FROM range(80000) a, range(20000) b WHERE (a.range * 7 + b.range) % 13 = 5"
)


class Holder:
    """A second process that holds the store file while its long ``kx.sql`` query runs."""

    def __init__(self, store_path: Path) -> None:
        env = {**os.environ, "KERNELEXT_STORE_WAIT": "600"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(HOLDER), str(store_path), LONG_QUERY],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.started = threading.Event()
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as lines:
            for line in lines:
                if "started" in line:
                    self.started.set()
                if "done" in line:
                    self.done.set()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(WAIT)

    @property
    def querying(self) -> bool:
        return self.started.is_set() and not self.done.is_set() and self.proc.poll() is None


@pytest.mark.slow
def test_stop_of_a_live_run_does_not_wait_while_another_process_holds_the_store(
    store: Store, store_path: Path
) -> None:
    store.backend.wait_timeout = 600  # type: ignore[attr-defined]  # outwait the query
    two_done = threading.Event()
    begun: list[int] = []

    @kx.agent(name="patient")
    def patient(run: kx.Run) -> None:
        for i in run.steps(range(2000)):  # bounded: ~100 s of 50 ms steps
            begun.append(i)
            if i == 2:
                two_done.set()
            threading.Event().wait(0.05)

    handle = patient.start(run_id="patient-1")
    assert two_done.wait(WAIT)
    holder = Holder(store_path)
    try:
        assert holder.started.wait(WAIT), "the other process never began its query"
        lock = HandoffLock(str(store_path)).holder()
        assert lock is not None and lock["pid"] == holder.proc.pid
        pressed: dict[str, Any] = {}

        def press() -> None:
            pressed["answer"] = handle.stop(source="button")
            pressed["completed"] = len(engine_of(handle.run).completed)
            pressed["query_running"] = holder.querying

        presser = threading.Thread(target=press)
        presser.start()
        presser.join(WAIT)
        assert pressed == {
            "answer": "stopping",
            "completed": pressed["completed"],
            "query_running": True,
        }, "h.stop() waited for the other process's query"
        assert holder.proc.wait(WAIT * 5) == 0 and holder.done.is_set()
    finally:
        holder.close()
    assert handle.wait(WAIT) == "suspended"
    completed = len(engine_of(handle.run).completed)
    assert completed <= pressed["completed"] + 1  # ended at the next step boundary
    assert len(begun) == completed  # no step began after the stop took hold
    assert [e["kind"] for e in store.events("patient-1")] == [
        "created",
        "stop_requested",
        "suspended",
    ]
    (stop,) = kinds(store, "patient-1", "stop_requested")
    assert (stop["from_status"], stop["to_status"], stop["source"]) == (
        "running",
        "stopping",
        "button",
    )
    row = store.get_run("patient-1")
    assert (row["status"], row["completed_steps"]) == ("suspended", completed)
