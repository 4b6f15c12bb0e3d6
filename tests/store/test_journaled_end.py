"""Reaching ``suspended`` never waits for another process (issue 21, item 3).

A run's end (suspended, completed, failed, needs_decision) is one ``run_end`` record
(``kernelext/_store/run_end.py``). On DuckDB it is journaled, so ``h.wait()`` returns while
another process holds the store file (a long ``kx.sql`` there); the fold puts it in the
tables once the file is free, the next opener after a SIGKILL, or a take-over by another
process first. Deliveries are counted on the real local HTTP server; the other processes
are real (``tests/support/store_holder.py``, ``tests/support/journaled_end.py``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer
from support.journaled_end import GATE, GATE_STEP, OWNER, journaled_end
from support.store_holder import Child, hold_store

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, actor, open_store
from kernelext._store.duckdb.journal import scan_journal
from kernelext._store.records import check_record
from kernelext._store.runs import StepEnd
from kernelext.status import Status, StepStatus

WAIT = 60.0
ITEMS = 40
LONG_QUERY = (
    "SELECT count(*) FROM range(80000) a, range(20000) b WHERE (a.range * 7 + b.range) % 13 = 5"
)


def kinds(store: Store, run_id: str) -> list[str]:
    return [e["kind"] for e in store.events(run_id)]


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    """Each test opens ``journaled-end``'s gate itself (once it asked for the stop)."""
    GATE.clear()
    yield
    GATE.set()  # a run of this process left at the gate ends


def delivered_once(server: DeliveryServer, run_id: str) -> None:
    """Every item of the run reached the server, each exactly once."""
    got = Counter(d["body"]["item"] for d in list(server.deliveries) if d["body"]["run"] == run_id)
    assert got == dict.fromkeys(range(ITEMS), 1), sorted(n for n, c in got.items() if c != 1)


def quarantined(store: Store) -> int:
    return int(store.read("SELECT count(*) FROM quarantine")[0][0])


# -- the record ---------------------------------------------------------------------------------
@pytest.mark.both_backends
def test_a_run_end_moves_the_run_ends_its_step_and_releases_claims_once(store_path: Any) -> None:
    """DuckDB journals it (a read folds it first), PostgreSQL commits it at once; either
    way one move, one event, the open step ended, the claims released, and an end asked
    again of a run no longer live changes nothing."""
    with open_store(str(store_path)) as store:
        assert store.create_run("end-1", "agent", owner=actor())
        step = uuid.uuid4()
        store.begin_step("end-1", step, 0, "s0", None)
        store.claim("end-1", "printer:2")
        failed = StepEnd(step, StepStatus.FAILED, "ValueError: boom", False, 0.5)
        end = {"kind": "failed", "source": "engine", "reason": "ValueError: boom", "step": failed}
        assert store.end_run("end-1", Status.FAILED, **end) == "failed"
        row = store.get_run("end-1")
        assert (row["status"], row["reason"], row["deadline"]) == (
            "failed",
            "ValueError: boom",
            None,
        )
        (stored,) = store.steps("end-1")
        assert (stored["status"], stored["error"], stored["duration_s"]) == (
            "failed",
            "ValueError: boom",
            0.5,
        )
        assert kinds(store, "end-1") == ["created", "claim_taken", "failed", "claim_released"]
        assert store.read("SELECT release_reason FROM claims") == [("failed",)]
        assert store.journaled_end("end-1") is None  # the file is free: in the tables now

        again = {**end, "step": None}
        assert store.end_run("end-1", Status.FAILED, **again) == "failed"
        assert kinds(store, "end-1") == ["created", "claim_taken", "failed", "claim_released"]
        with pytest.raises(ValueError, match="run_end record moves a run to one of"):
            store.end_run("end-1", Status.RUNNING, kind="x", source="engine")
        with pytest.raises(ValueError, match="a run_end record needs who"):
            check_record("run_end", {"run_id": "end-1", "status": "failed", "kind": "failed",
                                     "at": store.now()})  # fmt: skip


# -- this process owns the run ----------------------------------------------------------------
@pytest.mark.slow
def test_wait_returns_suspended_while_another_process_runs_a_long_query(
    store: Store, store_path: Path, delivery_server: DeliveryServer
) -> None:
    store.backend.wait_timeout = 600  # type: ignore[attr-defined]  # outwait the query
    handle = journaled_end.start(delivery_server.url, ITEMS, run_id="held-1")
    delivery_server.wait_for(GATE_STEP + 1, timeout=WAIT)  # it waits at the gate
    holder = hold_store(str(store_path), LONG_QUERY)
    try:
        assert handle.stop(source="button") == "stopping"
        GATE.set()  # the step ends: the stop lands at its boundary
        status = handle.wait(WAIT)
        querying = holder.running and not holder.printed("done")
        assert store.hot_path is not None
        only_journaled = store.hot_path.unfolded  # not in the tables: the file is the reader's
        assert (status, querying, only_journaled) == ("suspended", True, True), (
            "h.wait() waited for the other process's query"
        )
        assert handle.status == "suspended"  # what this process recorded, without the file
        holder.expect("done")
        assert holder.proc.wait(WAIT) == 0
    finally:
        holder.close()

    row = store.get_run("held-1")  # once the file is free, the fold put it in the tables
    assert row["status"] == "suspended" and not store.hot_path.unfolded
    assert kinds(store, "held-1") == ["created", "stop_requested", "suspended"]
    event = store.events("held-1")[-1]
    assert (event["from_status"], event["to_status"], event["source"]) == (
        "stopping",
        "suspended",
        "button",
    )
    detail = json.loads(event["detail"])
    assert detail["forced"] is False and detail["deadline"] == row["deadline"].isoformat()
    assert row["reason"] == "user_stop" and row["deadline"] > event["occurred_at"]
    assert not [s for s in store.steps("held-1") if s["status"] == "running"]
    assert row["completed_steps"] == GATE_STEP + 1 == len(delivery_server.deliveries)

    again = kx.resume("held-1")
    assert again.wait(WAIT) == "completed"
    assert kinds(store, "held-1")[-2:] == ["resumed", "completed"]
    delivered_once(delivery_server, "held-1")


@kx.agent(name="journaled-claim")
def claimer(run: kx.Run, ready: threading.Event, go: threading.Event) -> str:
    run.claim("printer:1")
    for _ in run.steps(range(1)):
        ready.set()
        go.wait(WAIT)
    return "done"


def test_completion_and_its_claims_are_journaled_too(store: Store, store_path: Path) -> None:
    store.backend.wait_timeout = 600  # type: ignore[attr-defined]
    ready, go = threading.Event(), threading.Event()
    handle = claimer.start(ready, go, run_id="held-claim")
    assert ready.wait(WAIT)
    holder = hold_store(str(store_path))
    try:
        go.set()
        status = handle.wait(WAIT)
        assert store.hot_path is not None and store.hot_path.unfolded
        assert (status, holder.running) == ("completed", True)
        holder.send("release")
        holder.expect("released")
    finally:
        holder.close()
    assert handle.result == "done"
    assert store.get_run("held-claim")["status"] == "completed"
    assert kinds(store, "held-claim")[-2:] == ["completed", "claim_released"]
    rows = store.read("SELECT release_reason FROM claims WHERE run_id = 'held-claim'")
    assert rows == [("completed",)]


@pytest.mark.slow
def test_a_resume_right_after_a_journaled_suspension_sees_it_suspended(
    store: Store, store_path: Path, delivery_server: DeliveryServer
) -> None:
    store.backend.wait_timeout = 600  # type: ignore[attr-defined]
    handle = journaled_end.start(delivery_server.url, ITEMS, run_id="held-2")
    delivery_server.wait_for(GATE_STEP + 1, timeout=WAIT)
    holder = hold_store(str(store_path))
    resumed: dict[str, Any] = {}

    def resume() -> None:
        try:
            resumed["handle"] = kx.resume("held-2")
        except BaseException as exc:
            resumed["error"] = exc

    try:
        assert handle.stop(source="button") == "stopping"
        GATE.set()
        assert handle.wait(WAIT) == "suspended"
        assert store.hot_path is not None and store.hot_path.unfolded
        thread = threading.Thread(target=resume)
        thread.start()  # waits for the file: its take-over comes after this process's fold
        holder.send("release")
        holder.expect("released")
        thread.join(WAIT)
    finally:
        holder.close()
    assert "error" not in resumed, resumed.get("error")
    assert resumed["handle"].wait(WAIT) == "completed"
    assert kinds(store, "held-2") == [
        "created",
        "stop_requested",
        "suspended",
        "resumed",
        "completed",
    ]
    delivered_once(delivery_server, "held-2")


# -- another process owns the run --------------------------------------------------------------
def stopped_owner(store_path: Path, server: DeliveryServer, run_id: str) -> tuple[Child, Child]:
    """An owner process whose run is stopped, and whose ``h.wait()`` returned ``suspended``,
    while a holder process keeps the store file (so nothing of it is folded yet)."""
    owner = Child("-c", OWNER, str(store_path), server.url, run_id, str(ITEMS))
    owner.expect("running")
    server.wait_for(GATE_STEP + 1, timeout=WAIT)  # it waits at the gate
    holder = hold_store(str(store_path))
    owner.send("stop")
    assert owner.expect("stop") == "stopping"
    assert owner.expect("waited") == "waited suspended"
    return owner, holder


@pytest.mark.slow
@pytest.mark.crash
def test_a_journaled_suspension_outlives_sigkill_and_the_next_opener_folds_it(
    store_path: Path, delivery_server: DeliveryServer
) -> None:
    owner, holder = stopped_owner(store_path, delivery_server, "held-3")
    try:
        journal = owner.expect("journal ").split(" ", 1)[1]
        os.kill(owner.proc.pid, signal.SIGKILL)
        owner.proc.wait(WAIT)
        ends = [d for _, kind, d in scan_journal(journal).records if kind == "run_end"]
        assert [(d["run_id"], d["status"]) for d in ends] == [("held-3", "suspended")]
        holder.send("release")
        holder.expect("released")
        assert holder.proc.wait(WAIT) == 0
    finally:
        owner.close()
        holder.close()
    with open_store(str(store_path), read_only=True) as before:  # reads, folds nothing
        assert before.get_run("held-3")["status"] == "running"  # its stop is journaled too
        assert kinds(before, "held-3") == ["created"]
    try:
        store = kx.open_store(str(store_path))  # the next opener folds the dead one's journal
        row = store.get_run("held-3")
        assert row["status"] == "suspended" and row["deadline"] is not None
        assert kinds(store, "held-3") == ["created", "stop_requested", "suspended"]
        assert not os.path.exists(journal) and quarantined(store) == 0
        assert len(delivery_server.deliveries) == row["completed_steps"] == GATE_STEP + 1
        again = kx.resume("held-3")
        assert again.wait(WAIT) == "completed"
        delivered_once(delivery_server, "held-3")
    finally:
        runtime().close()


@pytest.mark.slow
def test_another_process_resumes_a_run_whose_frozen_owner_journaled_its_suspension(
    store_path: Path, delivery_server: DeliveryServer
) -> None:
    """The owner lives (its lease is fresh) but cannot fold: a take-over folds the owner's
    journaled stop and suspension first, so the run is resumed, not refused as live."""
    owner, holder = stopped_owner(store_path, delivery_server, "held-4")
    os.kill(owner.proc.pid, signal.SIGSTOP)
    try:
        holder.send("release")
        holder.expect("released")
        store = kx.open_store(str(store_path))
        assert store.get_run("held-4")["status"] == "running"  # only its journal says more
        again = kx.resume("held-4")
        assert again.wait(WAIT) == "completed"
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
        holder.close()
    try:
        owner.send("exit")  # its own fold finds its records applied before: nothing twice
        assert owner.proc.wait(WAIT) == 0
        assert kinds(store, "held-4") == [
            "created",
            "stop_requested",
            "suspended",
            "resumed",
            "completed",
        ]
        assert quarantined(store) == 0
        delivered_once(delivery_server, "held-4")
    finally:
        owner.close()
        runtime().close()
