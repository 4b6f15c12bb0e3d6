"""The engine crash matrix (tests/crash/engine_worker.py) on any store: kill, resume, compare."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crash import CRASH_DIR, Worker, WorkerPool, attempt_run, open_checked, whole_lines

STEPS = 24
EARLY_KILL_SHARE = 0.2  # kills aimed at store open / resume bookkeeping, before `ready`
ENGINE_WORKER = CRASH_DIR / "engine_worker.py"


@dataclass
class KillTally:
    """What the kill loop did over all runs: attempts, kills, durable steps run again."""

    kills: int = 0
    attempts: int = 0
    reruns: list[tuple[str, str, int]] = field(default_factory=list)


def inspect_store(path: Path | str, run_id: str) -> tuple[str | None, set[str]]:
    """Open the store as a user would after a crash: schema intact, what is durable."""
    store = open_checked(path)
    try:
        row = store.find_run(run_id)
        completed = {step["key"] for step in store.completed_steps(run_id)}
        return (row["status"] if row else None), completed
    finally:
        store.close()


def side_log_lines(path: Path) -> list[tuple[str, str, int, int]]:
    """(run, step key, attempt, pid) for every step execution the workers logged."""
    lines = whole_lines(path, r"((?:pg-)?engine-\d+|reference),(s\d{3}),(\d+)-(\d+)")
    return [(m[1], m[2], int(m[3]), int(m[4])) for m in lines]


def attempt_once(worker: Worker, rng: random.Random, kill: bool, **go: Any) -> str:
    """Let ``worker`` run one attempt; kill it at a random moment if ``kill``.

    Returns "killed", "completed" or "done".
    """
    return attempt_run(
        worker,
        rng,
        kill,
        late=(0, 0.07),
        early_share=EARLY_KILL_SHARE,
        early=(0, 0.08),
        ends=("completed",),
        **go,
    )


def final_state(path: Path | str, run_id: str) -> dict[str, Any]:
    """The completed run's state; each of its steps completed exactly once."""
    from kernelext._core.lifecycle.resume import load_run
    from kernelext._store import open_store

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


def reference_state(pool: WorkerPool, rng: random.Random, store: str, side_log: Path) -> Any:
    """The state of the same agent run once, never interrupted, in a store of its own."""
    outcome = attempt_once(
        pool.take(),
        rng,
        False,
        store=store,
        run_id="reference",
        attempt=0,
        steps=STEPS,
        side_log=str(side_log),
        pause_ms=0,
    )
    assert outcome == "done"
    return final_state(store, "reference")


def resume_until_completed(
    pool: WorkerPool,
    rng: random.Random,
    store: str,
    run_id: str,
    side_log: Path,
    tally: KillTally,
    *,
    kills_wanted: int,
    pause_ms: float,
    max_attempts: int,
) -> None:
    """Start ``run_id``, then resume it after every kill (while ``tally`` has fewer than
    ``kills_wanted``) until it completes; steps durable before an attempt that ran again
    in it go to ``tally.reruns``."""
    for attempt in range(1, max_attempts + 1):
        status, durable = inspect_store(store, run_id)
        if status == "completed":
            return
        tally.attempts += 1
        outcome = attempt_once(
            pool.take(),
            rng,
            tally.kills < kills_wanted,
            store=store,
            run_id=run_id,
            attempt=attempt,
            steps=STEPS,
            side_log=str(side_log),
            pause_ms=pause_ms,
        )
        tally.kills += outcome == "killed"
        executed = {
            key for rid, key, att, _ in side_log_lines(side_log) if rid == run_id and att == attempt
        }
        tally.reruns += [(run_id, key, attempt) for key in executed & durable]
    pytest.fail(f"run {run_id} did not complete in {max_attempts} attempts")
