"""Crash injection for the effect ledger (issue 3): SIGKILL around every effect call.

A worker process (tests/crash/ledger_worker.py) runs an agent that makes 32 effect
calls over 8 steps; each call POSTs to the test's DeliveryServer (no dedupe, so a
duplicate would show) with the ledger's key as Idempotency-Key. The test kills the
worker at seeded random moments, at least ``KERNELEXT_CRASH_LEDGER_KILLS`` (default
200) times over consecutive runs, in two chains at once (each with its own store, delivery
server and workers: the kills are independent, the waits overlap). The worker's crash
hook writes a marker and pauses at each point of a call, so kills land between intent
commit and call, between call and outcome commit, and between effects; the test tells which window
each kill hit from the markers, the store and the server.

After every kill the test opens the store (it must open cleanly), and reconciles
each unknown effect deliberately against the server's log: "it happened" with the
server's response when the server received that key, "it did not happen"
otherwise. Each decision is recorded. Then it resumes in a new process.
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
from kernelext._core.lifecycle.resume import load_run
from kernelext._store import Store

pytestmark = [pytest.mark.crash, pytest.mark.slow]

STEPS, PER_STEP = 8, 4
CALLS = STEPS * PER_STEP
MIN_KILLS = int(os.environ.get("KERNELEXT_CRASH_LEDGER_KILLS", "200"))
LANES = 2  # chains of runs killed at once, each on its own store and delivery server
SEED = int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611"))
PAUSE_MS = 3.0
EARLY_KILL_SHARE = 0.1  # aimed at store open and the resume bookkeeping
LATE_KILL_MAX = 0.15  # seconds after the run executes
MAX_ATTEMPTS_PER_RUN = 400
EFFECTS_READABLE = "SELECT count(*) FROM effects"  # after a crash, besides the schema
WINDOWS = ("startup", "intent_to_call", "call_to_outcome", "between_effects")


@dataclass
class Matrix:
    kills: int = 0
    attempts: int = 0
    needs_decision_attempts: int = 0
    windows: Counter[str] = field(default_factory=Counter)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    def text(self, duplicates: int) -> str:
        kinds = Counter(d["decision"] for d in self.decisions)
        return json.dumps(
            {
                "runs": len(self.runs),
                "effects": len(self.runs) * CALLS,
                "attempts": self.attempts,
                "kill_points": self.kills,
                "kills_per_window": {w: self.windows[w] for w in WINDOWS},
                "needs_decision_resumes": self.needs_decision_attempts,
                "unknowns_seen": len(self.decisions),
                "decisions": dict(kinds),
                "duplicates": duplicates,
            },
            indent=1,
        )


def markers_of(path: Path, attempt: int) -> list[tuple[str, str]]:
    lines = whole_lines(path, r"(\d+) ([a-z]+) ([0-9a-f-]{36})")
    return [(m[2], m[3]) for m in lines if int(m[1]) == attempt]


def classify_kill(
    store: Store, run_id: str, server: DeliveryServer, markers: list[tuple[str, str]]
) -> str:
    """Which window of an effect call the kill landed in.

    Calls are sequential, so at most one intent can be open. An open intent whose key
    the server has seen was killed after the call, before its outcome commit; one the
    server has not seen, before (or during) the call. Without an open intent, the
    markers tell whether the run had reached its effects at all.
    """
    pending = [row for row in store.load_effects(run_id).values() if row["status"] == "pending"]
    assert len(pending) <= 1, f"more than one intent open at once: {pending}"
    if pending:
        key = str(pending[0]["key"])
        if markers and markers[-1] == ("intent", key):
            assert server.count(key) <= 1, f"{key} was delivered twice"
        return "call_to_outcome" if server.count(key) else "intent_to_call"
    return "between_effects" if markers else "startup"


def reconcile_against_server(
    store: Store, run_id: str, server: DeliveryServer, matrix: Matrix
) -> None:
    """Decide every unknown effect from the server's log, and record the decision."""
    for unknown, received in unknowns_decided_from(server.deliveries, run_id, store=store):
        key = str(unknown.key)
        assert unknown.tool == "deliver"
        assert unknown.run_id == run_id
        matrix.decisions.append(
            {
                "run": run_id,
                "key": key,
                "step": unknown.step_key,
                "decision": "applied" if received else "not_applied",
                "deliveries_at_decision": len(received),
            }
        )


def check_run(store: Store, run_id: str, log: list[dict[str, Any]]) -> list[str]:
    """Final checks of one run; returns the keys delivered more than once."""
    assert store.get_run(run_id)["status"] == "completed"
    rows = store.load_effects(run_id)
    assert len(rows) == CALLS, f"{run_id}: {len(rows)} ledger rows, expected {CALLS}"
    assert {r["status"] for r in rows.values()} == {"applied"}
    assert sorted((r["step_key"], r["call_ordinal"]) for r in rows.values()) == sorted(
        (f"step-{s}", i) for s in range(STEPS) for i in range(PER_STEP)
    )
    counts = Counter(d["idempotency_key"] for d in log if d["body"]["run"] == run_id)
    keys = {str(k) for k in rows}
    assert set(counts) == keys, f"{run_id}: deliveries without a ledger row, or the reverse"
    state = load_run(store, run_id, "crash-ledger", None, False).state
    assert state["sent"] == CALLS
    by_call = {
        f"{d['body']['step']}.{d['body']['index']}": d["seq"]
        for d in log
        if d["body"]["run"] == run_id
    }
    assert state["deliveries"] == by_call, "the run's state must hold what the server answered"
    return [key for key, n in counts.items() if n != 1]


def kill_one_chain(
    lane: int, kills: int, folder: Path, server: DeliveryServer, matrix: Matrix
) -> None:
    """Runs of one store, one after the other, each killed and resumed until it completes,
    until ``kills`` kills landed (``matrix`` counts them)."""
    rng = random.Random(SEED + lane)
    store_path = folder / "store" / "ledger.duckdb"
    markers = folder / "markers.txt"
    pool = WorkerPool(CRASH_DIR / "ledger_worker.py", folder)
    try:
        while matrix.kills < kills:
            run_id = f"ledger-{lane}-{len(matrix.runs)}"
            matrix.runs.append(run_id)
            killed_attempt: int | None = None
            for _ in range(MAX_ATTEMPTS_PER_RUN):
                store = open_checked(store_path, EFFECTS_READABLE)
                try:
                    if killed_attempt is not None:
                        window = classify_kill(
                            store, run_id, server, markers_of(markers, killed_attempt)
                        )
                        matrix.windows[window] += 1
                    row = store.find_run(run_id)
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
                    matrix.kills < kills,
                    late=(0, LATE_KILL_MAX),
                    early_share=EARLY_KILL_SHARE,
                    early=(0, 0.1),
                    store=str(store_path),
                    run_id=run_id,
                    attempt=matrix.attempts,
                    steps=STEPS,
                    per_step=PER_STEP,
                    url=server.url,
                    markers=str(markers),
                    pause_ms=PAUSE_MS,
                )
                killed_attempt = kill_landed(outcome, matrix.attempts, server)
                matrix.kills += killed_attempt is not None
                matrix.needs_decision_attempts += outcome == "needs_decision"
            else:
                pytest.fail(f"run {run_id} did not complete in {MAX_ATTEMPTS_PER_RUN} attempts")

        log = delivery_log(server)
        checked = each_run_checked(
            store_path,
            matrix.runs,
            lambda store, run_id: check_run(store, run_id, log),
            EFFECTS_READABLE,
        )
        matrix.duplicates = [key for keys in checked for key in keys]
        assert len(log) == len(matrix.runs) * CALLS
    finally:
        pool.close()


@pytest.mark.timeout(900)
def test_sigkill_around_effects_delivers_each_exactly_once(tmp_path: Path) -> None:
    """``LANES`` chains of runs at once, each on a store and a delivery server of its own
    (no dedupe, so a duplicate would show): the kills are independent, the test's waits
    (a worker's pauses, the server settling) overlap."""
    matrix = chains_added_up(tmp_path, LANES, MIN_KILLS, Matrix, kill_one_chain)
    print("\nledger crash matrix:\n" + matrix.text(len(matrix.duplicates)))

    decided = {d["key"] for d in matrix.decisions}
    # A key decided "not applied" is sent again and may be cut short again; once
    # decided "applied" it is never unknown again.
    applied = Counter(d["key"] for d in matrix.decisions if d["decision"] == "applied")
    assert set(applied.values()) <= {1}, "an effect was decided applied twice"
    unexplained = [key for key in matrix.duplicates if key not in decided]
    assert not unexplained, f"delivered more than once, no decision explains it: {unexplained}"
    assert not matrix.duplicates, f"duplicates: {matrix.duplicates}"
    assert matrix.kills >= MIN_KILLS
    for window in ("intent_to_call", "call_to_outcome", "between_effects"):
        assert matrix.windows[window] > 0, f"no kill landed in {window}: {matrix.windows}"
    kinds = Counter(d["decision"] for d in matrix.decisions)
    assert kinds["applied"] > 0 and kinds["not_applied"] > 0, kinds
