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
from pathlib import Path

import pytest
from support.engine_crash import (
    ENGINE_WORKER,
    STEPS,
    KillTally,
    final_state,
    reference_state,
    resume_until_completed,
    side_log_lines,
)

from crash import WorkerPool

pytestmark = [pytest.mark.crash, pytest.mark.slow]

PAUSE_MS = 4.0
MIN_KILLS = int(os.environ.get("KERNELEXT_CRASH_ENGINE_KILLS", "60"))
SEED = int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611"))
MAX_ATTEMPTS_PER_RUN = 400


@pytest.mark.timeout(600)
def test_sigkill_anywhere_then_resume_reaches_the_uninterrupted_state(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    side_log = tmp_path / "side.log"
    pool = WorkerPool(ENGINE_WORKER, tmp_path)
    try:
        # The reference: the same agent, never interrupted, in a store of its own.
        expected = reference_state(pool, rng, str(tmp_path / "reference.duckdb"), side_log)
        assert expected["total"] == sum(i * i for i in range(STEPS))
        assert expected["seen"] == [f"s{i:03d}" for i in range(STEPS)]

        store_path = tmp_path / "store" / "crash.duckdb"
        tally = KillTally()
        runs: list[str] = []
        while tally.kills < MIN_KILLS:
            run_id = f"engine-{len(runs)}"
            runs.append(run_id)
            resume_until_completed(
                pool,
                rng,
                str(store_path),
                run_id,
                side_log,
                tally,
                kills_wanted=MIN_KILLS,
                pause_ms=PAUSE_MS,
                max_attempts=MAX_ATTEMPTS_PER_RUN,
            )
            assert not tally.reruns, (
                f"steps durably completed before a resume ran again in it: {tally.reruns}"
            )
            assert final_state(store_path, run_id) == expected

        executions = side_log_lines(side_log)
        print(
            "\nengine crash matrix: "
            + json.dumps(
                {
                    "runs": len(runs),
                    "attempts": tally.attempts,
                    "kills": tally.kills,
                    "workers": pool.spawned,
                    "step_executions": len(executions),
                    "steps_completed": len(runs) * STEPS,
                    "reruns_of_durable_steps": len(tally.reruns),
                }
            )
        )
        assert tally.kills >= MIN_KILLS
        # The kills did interrupt steps: some executions were cut short and redone.
        assert len(executions) - STEPS > len(runs) * STEPS
    finally:
        pool.close()
