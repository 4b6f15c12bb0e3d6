"""SIGKILL mid-batch with an async agent and an async effect: each item delivered once.

A worker process (tests/crash/async_batch_worker.py) runs an ``async def`` agent that
awaits ``run.amap`` over 24 items, 6 at a time; each item awaits an ``async def`` effect
that POSTs to the test's DeliveryServer (no dedupe, so a duplicate would show) through an
asyncio client, with the ledger's key as Idempotency-Key. The test kills the worker at
seeded random moments, at least ``KERNELEXT_CRASH_ASYNC_KILLS`` (default 12) times over
consecutive runs, with several items in flight each time. After every kill the test opens
the store (it must open cleanly), decides each unknown effect against the server's log
("it happened" with the server's answer when the server received that key, "it did not
happen" otherwise) and resumes in a new process. At the end every item of every run was
delivered exactly once (0 duplicates, 0 missing), and each run's result holds what the
server answered.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.decisions import unknowns_decided_from
from support.http_server import DeliveryServer

from crash import CRASH_DIR, Worker, WorkerPool, attempt_run, kill_landed, open_checked, whole_lines
from crash.lanes import delivery_log, each_run_checked
from kernelext._core.encoding.keys import load_result
from kernelext._store import Store

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ITEMS, CONCURRENCY = 24, 6
MIN_KILLS = int(os.environ.get("KERNELEXT_CRASH_ASYNC_KILLS", "12"))
SEED = int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611"))
PAUSE_MS = 8.0
LATE_KILL_MAX = 0.12  # seconds after the run executes
MAX_ATTEMPTS_PER_RUN = 200


def reconcile_against_server(
    store: Store, run_id: str, server: DeliveryServer, decisions: list[dict[str, Any]]
) -> None:
    """Decide every unknown effect from the server's log, and record the decision."""
    for unknown, received in unknowns_decided_from(server.deliveries, run_id, store=store):
        key = str(unknown.key)
        assert unknown.tool == "adeliver"
        assert len(received) <= 1, f"{key} was delivered {len(received)} times"
        decisions.append({"key": key, "applied": bool(received), "step": unknown.step_key})


def run_attempt(
    worker: Worker, rng: random.Random, kill: bool, results: dict[str, Any], **go: Any
) -> str:
    """One attempt; returns "killed", "done", "completed" or "needs_decision". A run that
    ends here leaves the list ``run.amap`` returned in ``results[run_id]``."""
    outcome = attempt_run(worker, rng, kill, late=(0.01, LATE_KILL_MAX), **go)
    if outcome == "done":
        results[go["run_id"]] = json.loads(worker.last_line.split(" ", 1)[1])["deliveries"]
    return outcome


def in_flight_at_kill(store: Store, run_id: str, path: Path, attempt: int) -> int:
    """How many items were in flight when the kill landed: steps begun and not ended in
    the store, or calls whose intent the tool saw without their answer (the markers)."""
    running = sum(s["status"] == "running" for s in store.steps(run_id))
    lines = whole_lines(path, r"(\d+) (intent|delivered) ([0-9a-f-]{36})")
    marks = [(m[2], m[3]) for m in lines if int(m[1]) == attempt]
    intents = {key for kind, key in marks if kind == "intent"}
    return max(running, len(intents - {key for kind, key in marks if kind == "delivered"}))


def check_run(
    store: Store, run_id: str, log: list[dict[str, Any]], returned: list[int] | None
) -> list[str]:
    """Final checks of one run; returns the keys delivered more than once."""
    assert store.get_run(run_id)["status"] == "completed"
    rows = store.load_effects(run_id)
    assert len(rows) == ITEMS, f"{run_id}: {len(rows)} ledger rows, expected {ITEMS}"
    assert {r["status"] for r in rows.values()} == {"applied"}
    assert sorted((r["step_key"], r["call_ordinal"]) for r in rows.values()) == [
        (f"item-{i:03d}", 0) for i in range(ITEMS)
    ]
    completed = Counter(step["key"] for step in store.completed_steps(run_id))
    assert sorted(completed) == [f"item-{i:03d}" for i in range(ITEMS)]
    assert set(completed.values()) == {1}, f"an item completed twice: {completed}"
    mine = [d for d in log if d["body"]["run"] == run_id]
    counts = Counter(d["idempotency_key"] for d in mine)
    assert set(counts) == {str(k) for k in rows}, f"{run_id}: deliveries and ledger differ"
    # The value each item stored, and what run.amap returned at the end (values stored by
    # earlier attempts, and those decided at reconciliation), are what the server answered.
    by_item = {d["body"]["item"]: d["seq"] for d in mine}
    expected = [by_item[i] for i in range(ITEMS)]
    stored = store.item_results(run_id, list(completed))
    assert [load_result(stored[f"item-{i:03d}"]) for i in range(ITEMS)] == expected
    if returned is not None:  # None: killed after the run completed, before it printed
        assert returned == expected
    return [key for key, n in counts.items() if n != 1]


@pytest.mark.timeout(900)
def test_sigkill_mid_amap_with_async_effects_delivers_each_item_exactly_once(
    tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    assert not delivery_server.dedupe, "duplicates must be visible"
    rng = random.Random(SEED)
    store_path = tmp_path / "store" / "amap.duckdb"
    markers = tmp_path / "markers.txt"
    runs: list[str] = []
    decisions: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    kills = attempts = killed_in_flight = 0
    pool = WorkerPool(CRASH_DIR / "async_batch_worker.py", tmp_path)
    try:
        while kills < MIN_KILLS:
            run_id = f"amap-{len(runs)}"
            runs.append(run_id)
            killed: int | None = None
            for _ in range(MAX_ATTEMPTS_PER_RUN):
                store = open_checked(store_path)
                try:
                    if killed is not None:
                        killed_in_flight += in_flight_at_kill(store, run_id, markers, killed) > 1
                    row = store.find_run(run_id)
                    if row is not None and row["status"] == "completed":
                        break
                    if row is not None:
                        reconcile_against_server(store, run_id, delivery_server, decisions)
                finally:
                    store.close()
                attempts += 1
                outcome = run_attempt(
                    pool.take(),
                    rng,
                    kills < MIN_KILLS,
                    results,
                    store=str(store_path),
                    run_id=run_id,
                    attempt=attempts,
                    items=ITEMS,
                    concurrency=CONCURRENCY,
                    url=delivery_server.url,
                    markers=str(markers),
                    pause_ms=PAUSE_MS,
                )
                killed = kill_landed(outcome, attempts, delivery_server)
                kills += killed is not None
            else:
                pytest.fail(f"run {run_id} did not complete in {MAX_ATTEMPTS_PER_RUN} attempts")

        log = delivery_log(delivery_server)
        checked = each_run_checked(
            store_path,
            runs,
            lambda store, run_id: check_run(store, run_id, log, results.get(run_id)),
        )
        duplicates = [key for keys in checked for key in keys]
        summary = {
            "runs": len(runs),
            "attempts": attempts,
            "kills": kills,
            "kills_with_several_items_in_flight": killed_in_flight,
            "decisions": dict(Counter("applied" if d["applied"] else "not_applied"
                                      for d in decisions)),
            "duplicates": len(duplicates),
        }  # fmt: skip
        print("\nasync batch crash matrix:\n" + json.dumps(summary, indent=1))
        assert not duplicates, f"duplicates: {duplicates}"
        assert len(log) == len(runs) * ITEMS  # 0 missing, 0 extra
        assert kills >= MIN_KILLS
        assert killed_in_flight > 0, "no kill landed with several items in flight"
        assert decisions, "no kill left an effect unknown: the kills missed the calls"
    finally:
        pool.close()
