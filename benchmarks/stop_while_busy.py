"""``kernelext stop`` while the run's process keeps the store file busy with a long query.

The owner (``tests/support/sql_owner.py``) executes a run of short steps, then runs a
``kx.sql`` query for ``QUERY_S`` seconds. ``kernelext stop`` is started from another
process; measured per repetition:

- ``answer_s``: from starting the command to its answer (a Python start and import
  included, and the second it waits for the file before recording the request beside it);
- ``suspended_s``: from starting the command to the run's worker ending suspended;
- ``query_left_s``: how long the query still ran after the run suspended.

Run: ``.venv/bin/python -m benchmarks.stop_while_busy [REPS]`` (results printed as JSON).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUERY_S = "20"
ROOT = Path(__file__).resolve().parent.parent


def _once(folder: str, rep: int) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.store_holder import SUPPORT, Child

    store = os.path.join(folder, f"s{rep}.duckdb")
    owner = Child(str(SUPPORT / "sql_owner.py"), store, "bench", QUERY_S)
    try:
        owner.expect("querying")
        time.sleep(1.0)  # the query is well under way
        began = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "kernelext", "stop", "bench", "--store", store],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        answered = time.time()
        if "store is busy" not in done.stdout:
            raise RuntimeError(f"stop_while_busy: not recorded beside the store: {done.stdout}")
        suspended = float(owner.expect("suspended").split()[1])
        ended = float(owner.expect("query ended").split()[2])
        owner.proc.wait(120)
    finally:
        owner.close()
    return {
        "answer_s": answered - began,
        "suspended_s": suspended - began,
        "query_left_s": ended - suspended,
    }


def measure(reps: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kx-stop-busy-") as folder:
        laps = [_once(folder, rep) for rep in range(reps)]
    return {
        name: {
            "median": round(statistics.median(lap[name] for lap in laps), 3),
            "all": [round(lap[name], 3) for lap in laps],
        }
        for name in ("answer_s", "suspended_s", "query_left_s")
    }


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=2))
