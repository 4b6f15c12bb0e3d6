"""The size and drawing time of ``kx.timeline`` HTML as a run grows (folded past a bound).

``python -m benchmarks.timeline_size [STEPS ...]`` (default 1000 1999 2000 100000): for a
synthetic batch of STEPS steps, one effect each (the store's row shapes, built in memory),
prints the time ``Timeline.from_rows`` takes, the bytes of ``.html()`` and its drawing time.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any

from kernelext._core.views.timeline import Timeline

T0 = dt.datetime(2026, 3, 2, 9, 0, 0)


def rows(n: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    run = {"id": "big", "agent": "score", "status": "completed", "lease_until": None}
    at = [T0 + dt.timedelta(seconds=i * 0.01) for i in range(n)]
    steps = [
        {"ordinal": i, "key": f"row-{i}", "status": "failed" if i % 97 == 0 else "completed",
         "started_at": at[i], "ended_at": None, "duration_s": 0.05, "forced": False,
         "error": None}
        for i in range(n)
    ]  # fmt: skip
    effects = [
        {"key": f"k{i}", "tool": "post", "status": "applied", "step_key": f"row-{i}",
         "step_ordinal": i, "call_ordinal": 0, "intent_at": at[i], "outcome_at": None,
         "decided_by": None, "error": None}
        for i in range(n)
    ]  # fmt: skip
    end = T0 + dt.timedelta(seconds=n * 0.01 + 1)
    events = [
        {"kind": "created", "occurred_at": T0, "to_status": "running"},
        {"kind": "completed", "occurred_at": end, "to_status": "completed"},
    ]
    return run, steps, effects, events


def main(sizes: list[int]) -> None:
    for n in sizes:
        run, steps, effects, events = rows(n)
        t0 = time.perf_counter()
        tl = Timeline.from_rows(run, steps, effects, events, now=T0 + dt.timedelta(hours=1))
        t1 = time.perf_counter()
        page = tl.html()
        t2 = time.perf_counter()
        print(
            f"{n:>7} steps: rows {t1 - t0:6.2f} s, html {len(page.encode()):>10,} bytes "
            f"in {t2 - t1:6.2f} s{' (folded)' if 'drawn folded' in tl.text() else ''}"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 1999, 2000, 100000])
