"""Crash injection for the run engine (issue 2): SIGKILL at random points, resume each time.

A worker process (tests/crash/engine_worker.py) runs a 24-step agent; the test kills
it at seeded random moments (during store open and resume as well as inside and
between steps) and resumes the run in a new process each time, until it completes.
Runs follow each other until at least ``KERNELEXT_CRASH_ENGINE_KILLS`` (default 60)
kills have landed. Between attempts the test opens the store itself: it must open
cleanly, and it tells which steps were durably completed before the next resume.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from crash import CRASH_DIR, Worker, WorkerPool, whole_lines
from kernelext._core.lifecycle.resume import load_run
from kernelext._store import open_store
from kernelext._store.schema import MIGRATIONS

pytestmark = [pytest.mark.crash, pytest.mark.slow]

STEPS = 24
PAUSE_MS = 4.0
MIN_KILLS = int(os.environ.get("KERNELEXT_CRASH_ENGINE_KILLS", "60"))
SEED = int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611"))
MAX_ATTEMPTS_PER_RUN = 400
EARLY_KILL_SHARE = 0.2  # kills aimed at store open / resume bookkeeping, before `ready`


def inspect_store(path: Path, run_id: str) -> tuple[str | None, set[str]]:
    """Open the store as a user would after a crash: schema intact, what is durable."""
    store = open_store(str(path))
    try:
        assert store.schema_version() == MIGRATIONS[-1].version
        row = store.find_run(run_id)
        completed = {step["key"] for step in store.completed_steps(run_id)}
        return (row["status"] if row else None), completed
    finally:
        store.close()


def side_log_lines(path: Path) -> list[tuple[str, str, int, int]]:
    """(run, step key, attempt, pid) for every step execution the workers logged."""
    lines = whole_lines(path, r"(engine-\d+|reference),(s\d{3}),(\d+)-(\d+)")
    return [(m[1], m[2], int(m[3]), int(m[4])) for m in lines]


def attempt_once(worker: Worker, rng: random.Random, kill: bool, **go: Any) -> str:
    """Let ``worker`` run one attempt; kill it at a random moment if ``kill``.

    Returns "killed", "completed", "done" or "needs_decision".
    """
    worker.go(**go)
    if kill and rng.random() < EARLY_KILL_SHARE:
        time.sleep(rng.uniform(0, 0.08))
    else:
        line = worker.expect("ready", "completed")
        if line == "completed":
            assert worker.reap() == 0, worker.stderr()
            return "completed"
        if kill:
            time.sleep(rng.uniform(0, 0.07))
    if kill and worker.kill():
        return "killed"
    line = worker.expect("ready", "done", "completed")
    if line.startswith("ready"):
        line = worker.expect("done")
    assert worker.reap() == 0, worker.stderr()
    return line.split(" ", 1)[0]


def final_state(path: Path, run_id: str) -> dict[str, Any]:
    store = open_store(str(path))
    try:
        assert store.get_run(run_id)["status"] == "completed"
        state: dict[str, Any] = load_run(store, run_id, "crash-engine", None, False).state
        completed = Counter(step["key"] for step in store.completed_steps(run_id))
        assert sorted(completed) == [f"s{i:03d}" for i in range(STEPS)]
        assert set(completed.values()) == {1}, f"a step completed twice: {completed}"
        return state
    finally:
        store.close()


@pytest.mark.timeout(600)
def test_sigkill_anywhere_then_resume_reaches_the_uninterrupted_state(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    side_log = tmp_path / "side.log"
    pool = WorkerPool(CRASH_DIR / "engine_worker.py", tmp_path)
    try:
        # The reference: the same agent, never interrupted, in a store of its own.
        reference = tmp_path / "reference.duckdb"
        worker = pool.take()
        outcome = attempt_once(
            worker,
            rng,
            False,
            store=str(reference),
            run_id="reference",
            attempt=0,
            steps=STEPS,
            side_log=str(side_log),
            pause_ms=0,
        )
        assert outcome == "done"
        expected = final_state(reference, "reference")
        assert expected["total"] == sum(i * i for i in range(STEPS))
        assert expected["seen"] == [f"s{i:03d}" for i in range(STEPS)]

        store_path = tmp_path / "store" / "crash.duckdb"
        kills = 0
        attempts = 0
        runs: list[str] = []
        reruns_of_durable_steps: list[tuple[str, str, int]] = []
        while kills < MIN_KILLS:
            run_id = f"engine-{len(runs)}"
            runs.append(run_id)
            for attempt in range(1, MAX_ATTEMPTS_PER_RUN + 1):
                status, durable = inspect_store(store_path, run_id)
                if status == "completed":
                    break
                attempts += 1
                outcome = attempt_once(
                    pool.take(),
                    rng,
                    kills < MIN_KILLS,
                    store=str(store_path),
                    run_id=run_id,
                    attempt=attempt,
                    steps=STEPS,
                    side_log=str(side_log),
                    pause_ms=PAUSE_MS,
                )
                kills += outcome == "killed"
                executed = {
                    key
                    for rid, key, att, _ in side_log_lines(side_log)
                    if rid == run_id and att == attempt
                }
                reruns_of_durable_steps += [(run_id, key, attempt) for key in executed & durable]
            else:
                pytest.fail(f"run {run_id} did not complete in {MAX_ATTEMPTS_PER_RUN} attempts")
            assert not reruns_of_durable_steps, (
                f"steps durably completed before a resume ran again in it: "
                f"{reruns_of_durable_steps}"
            )
            assert final_state(store_path, run_id) == expected

        executions = side_log_lines(side_log)
        print(
            "\nengine crash matrix: "
            + json.dumps(
                {
                    "runs": len(runs),
                    "attempts": attempts,
                    "kills": kills,
                    "workers": pool.spawned,
                    "step_executions": len(executions),
                    "steps_completed": len(runs) * STEPS,
                    "reruns_of_durable_steps": len(reruns_of_durable_steps),
                }
            )
        )
        assert kills >= MIN_KILLS
        # The kills did interrupt steps: some executions were cut short and redone.
        assert len(executions) - STEPS > len(runs) * STEPS
    finally:
        pool.close()
