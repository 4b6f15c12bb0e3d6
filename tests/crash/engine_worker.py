"""Worker process for the engine crash test (tests/crash/test_crash_engine.py).

Defines the agent ``crash-engine``: ``steps`` steps over a small state. Every step
body appends ``run,key,attempt-pid`` to a side log (fsync'ed) before the step
finishes, so the test sees every execution, including the ones a kill cut short.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``,
``run_id``, ``attempt``, ``steps``, ``side_log`` and ``pause_ms`` (each step sleeps
a random 0..pause_ms milliseconds so that kills land in every part of a step).
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Mapping
from typing import Any

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash import append_line, serve_one_run

SIDE_LOG = ""
ATTEMPT = 0
PAUSE_MS = 0.0
RNG = random.Random(0)


@kx.agent(name="crash-engine")
def crash_engine(run: kx.Run, steps: int) -> dict[str, Any]:
    for i in run.steps(range(steps), key=lambda i: f"s{i:03d}"):
        key = f"s{i:03d}"
        append_line(SIDE_LOG, f"{run.id},{key},{ATTEMPT}-{os.getpid()}")
        run.state["total"] = run.state.get("total", 0) + i * i
        run.state["parity"] = i % 2  # goes back to earlier values: content-addressed blobs
        run.state.setdefault("seen", []).append(key)  # grows: stored as deltas
        run.state["last"] = key
        time.sleep(RNG.uniform(0, PAUSE_MS) / 1000)
    return dict(run.state)


def take_command(command: Mapping[str, Any]) -> None:
    global SIDE_LOG, ATTEMPT, PAUSE_MS
    SIDE_LOG = command["side_log"]
    ATTEMPT = int(command["attempt"])
    PAUSE_MS = float(command.get("pause_ms", 0))


def main() -> int:
    return serve_one_run(
        lambda command, store: crash_engine.start(
            int(command["steps"]), run_id=command["run_id"], store=store
        ),
        take_command,
        RNG,
    )


if __name__ == "__main__":
    sys.exit(main())
