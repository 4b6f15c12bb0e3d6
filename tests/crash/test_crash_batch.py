"""Crash injection for ``run.map`` (issue 21): SIGKILL mid-batch, again and again.

A worker process (tests/crash/batch_worker.py) runs an agent whose ``run.map`` goes
through ``ITEMS`` items, ``CONCURRENCY`` at once, each item one ``@kx.effect`` POST to the
test's DeliveryServer (no dedupe, so a duplicate would show; its JSON-lines log is the
ground truth) with the ledger's key as ``Idempotency-Key``. The test SIGKILLs the worker
at seeded random moments while items are in flight, and resumes the run in a new
process, until it completes; runs follow each other until at least
``KERNELEXT_CRASH_BATCH_KILLS`` (default 50) kills landed mid-batch, in two chains at once
(each with its own store, delivery server and workers).

After every kill the test opens the store (it must open cleanly), notes what it holds
(the items completed, the intents left open and whether the server saw them), and
decides each unknown effect from the server's log, as a person would: "it happened",
with the server's response, when the log has a delivery for that key, "it did not
happen" otherwise. Then it resumes the run in a new process.

Checked: no item completed before an attempt runs again in it; at the end every item
was delivered exactly once (by idempotency key and by item: no duplicate, none
missing), the list ``run.map`` returned is in input order with what the server
answered for each item, and the ledger has one applied row per item, keyed under the
item's step.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.decisions import unknowns_decided_from
from support.http_server import DeliveryServer

from crash import (
    CRASH_DIR,
    WorkerPool,
    attempt_run,
    kill_landed,
    open_checked,
    whole_lines,
)
from crash.lanes import chains_added_up, delivery_log, each_run_checked
from kernelext._core.ledger.effect import effect_key
from kernelext._core.lifecycle.resume import load_run
from kernelext._store import Store

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ITEMS, CONCURRENCY = 300, 16
MIN_KILLS = int(os.environ.get("KERNELEXT_CRASH_BATCH_KILLS", "50"))
LANES = 2  # chains of runs killed at once, each on its own store and delivery server
SEED = int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611"))
PAUSE_MS = 4.0  # each item dawdles up to this before and after its POST
SERVER_DELAY = 0.004  # the server answers this long after recording a delivery
KILL_AFTER = (0.01, 0.12)  # seconds after the worker says the run executes
MAX_ATTEMPTS_PER_RUN = 200
TOOL = "deliver_item"


@dataclass
class Matrix:
    kills: int = 0  # every SIGKILL that landed
    mid_batch: int = 0  # ... with items of this attempt begun and the batch not done
    attempts: int = 0
    needs_decision_attempts: int = 0
    open_intents: Counter[str] = field(default_factory=Counter)  # seen / unseen by the server
    decisions: list[dict[str, Any]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)

    def text(self) -> str:
        return json.dumps(
            {
                "runs": len(self.runs),
                "items": len(self.runs) * ITEMS,
                "attempts": self.attempts,
                "kills": self.kills,
                "kills_mid_batch": self.mid_batch,
                "needs_decision_resumes": self.needs_decision_attempts,
                "intents_open_at_a_kill": dict(self.open_intents),
                "decisions": dict(Counter(d["decision"] for d in self.decisions)),
            },
            indent=1,
        )


def item_key(run_id: str, item: int) -> str:
    return str(effect_key(run_id, f"item-{item}", TOOL, 0))


def begun_in(markers: Path, attempt: int) -> set[int]:
    """The items whose body started in ``attempt`` (the worker's markers)."""
    lines = whole_lines(markers, r"(\d+) begin (\d+)")
    return {int(m[2]) for m in lines if int(m[1]) == attempt}


def completed_items(store: Store, run_id: str) -> set[int]:
    return {
        int(step["key"].removeprefix("item-"))
        for step in store.completed_steps(run_id)
        if step["key"].startswith("item-")
    }


def note_open_intents(store: Store, run_id: str, server: DeliveryServer, matrix: Matrix) -> int:
    """After a kill: the intents left open (items in flight inside their call)."""
    pending = [r for r in store.load_effects(run_id).values() if r["status"] == "pending"]
    for row in pending:
        seen = server.count(str(row["key"]))
        assert seen <= 1, f"{row['key']} was delivered {seen} times"
        matrix.open_intents["server_saw_it" if seen else "server_never_saw_it"] += 1
    return len(pending)


def reconcile_against_server(
    store: Store, run_id: str, server: DeliveryServer, matrix: Matrix
) -> None:
    """Decide every unknown effect from the server's log, and record the decision."""
    for unknown, received in unknowns_decided_from(server.deliveries, run_id, store=store):
        key = str(unknown.key)
        assert unknown.tool == TOOL and unknown.run_id == run_id
        assert unknown.step_key.startswith("item-"), unknown.step_key
        assert len(received) <= 1, f"{key} was delivered {len(received)} times"
        matrix.decisions.append(
            {"run": run_id, "key": key, "decision": "applied" if received else "not_applied"}
        )


def check_run(store: Store, run_id: str, log: list[dict[str, Any]]) -> None:
    """Final checks of one run: each item delivered once, results in order, the ledger."""
    assert store.get_run(run_id)["status"] == "completed"
    mine = [d for d in log if d["body"]["run"] == run_id]
    by_key = Counter(d["idempotency_key"] for d in mine)
    by_item = Counter(d["body"]["item"] for d in mine)
    duplicates = {k: n for k, n in by_key.items() if n != 1}
    assert not duplicates, f"{run_id}: delivered more than once: {duplicates}"
    assert {k: n for k, n in by_item.items() if n != 1} == {}, f"{run_id}: an item twice"
    missing = sorted(set(range(ITEMS)) - set(by_item))
    assert not missing, f"{run_id}: items never delivered: {missing}"
    assert set(by_key) == {item_key(run_id, i) for i in range(ITEMS)}

    rows = store.load_effects(run_id)
    assert len(rows) == ITEMS, f"{run_id}: {len(rows)} ledger rows, expected {ITEMS}"
    assert {r["status"] for r in rows.values()} == {"applied"}
    assert sorted((r["step_key"], r["call_ordinal"]) for r in rows.values()) == sorted(
        (f"item-{i}", 0) for i in range(ITEMS)
    )
    assert {str(k) for k in rows} == set(by_key)

    completed = Counter(s["key"] for s in store.completed_steps(run_id))
    assert completed == Counter([f"item-{i}" for i in range(ITEMS)] + ["results"]), (
        f"{run_id}: each item is one completed step"
    )
    seq = {d["body"]["item"]: d["seq"] for d in mine}
    state = load_run(store, run_id, "crash-batch", None, False).state
    assert state["results"] == [
        {"item": i, "delivery": seq[i], "key": item_key(run_id, i)} for i in range(ITEMS)
    ], "run.map returns every item's value, in input order, as the server answered it"


def kill_one_chain(
    lane: int, kills: int, folder: Path, server: DeliveryServer, matrix: Matrix
) -> None:
    """Runs of one store, one after the other, each killed mid-batch and resumed until it
    completes, until ``kills`` kills landed mid-batch (``matrix`` counts them)."""
    rng = random.Random(SEED + lane)
    store_path = folder / "store" / "batch.duckdb"
    store_path.parent.mkdir()
    markers = folder / "markers.txt"
    pool = WorkerPool(CRASH_DIR / "batch_worker.py", folder)
    try:
        while matrix.mid_batch < kills:
            run_id = f"batch-{lane}-{len(matrix.runs)}"
            matrix.runs.append(run_id)
            killed: int | None = None
            for _ in range(MAX_ATTEMPTS_PER_RUN):
                store = open_checked(store_path)
                try:
                    row = store.find_run(run_id)
                    done_before = completed_items(store, run_id) if row else set()
                    if killed is not None:
                        in_call = note_open_intents(store, run_id, server, matrix)
                        if begun_in(markers, killed) and (len(done_before) < ITEMS or in_call):
                            matrix.mid_batch += 1
                    if row is not None and row["status"] == "completed":
                        break
                    if row is not None:
                        reconcile_against_server(store, run_id, server, matrix)
                finally:
                    store.close()
                matrix.attempts += 1
                outcome = attempt_run(
                    pool.take(),
                    rng,
                    matrix.mid_batch < kills,
                    late=KILL_AFTER,
                    store=str(store_path),
                    run_id=run_id,
                    attempt=matrix.attempts,
                    items=ITEMS,
                    concurrency=CONCURRENCY,
                    url=server.url,
                    markers=str(markers),
                    pause_ms=PAUSE_MS,
                )
                again = begun_in(markers, matrix.attempts) & done_before
                assert not again, f"{run_id}: completed items ran again: {sorted(again)}"
                killed = kill_landed(outcome, matrix.attempts, server)
                matrix.kills += killed is not None
                matrix.needs_decision_attempts += outcome == "needs_decision"
            else:
                pytest.fail(f"run {run_id} did not complete in {MAX_ATTEMPTS_PER_RUN} attempts")

        log = delivery_log(server)
        each_run_checked(
            store_path, matrix.runs, lambda store, run_id: check_run(store, run_id, log)
        )
        assert len(log) == len(matrix.runs) * ITEMS
    finally:
        pool.close()


@pytest.mark.timeout(600)
def test_sigkill_mid_batch_delivers_each_item_exactly_once(tmp_path: Path) -> None:
    """``LANES`` chains of runs at once, each on a store and a delivery server of its own
    (no dedupe, so a duplicate would show): the kills are independent, the waits overlap."""
    matrix = chains_added_up(tmp_path, LANES, MIN_KILLS, Matrix, kill_one_chain, delay=SERVER_DELAY)
    print("\nbatch crash matrix:\n" + matrix.text())
    assert matrix.mid_batch >= MIN_KILLS
    # Kills found items inside their call, before and after the server had it.
    assert matrix.open_intents["server_saw_it"] > 0, matrix.text()
    assert matrix.open_intents["server_never_saw_it"] > 0, matrix.text()
    kinds = Counter(d["decision"] for d in matrix.decisions)
    assert kinds["applied"] > 0 and kinds["not_applied"] > 0, kinds
