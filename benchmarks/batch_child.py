"""Child process of the batch benchmark's big map: ``python -m benchmarks.batch_child MODE ...``.

- ``full STORE N C``: run ``big_agent`` over N items, C at a time, to the end; report its
  wall time, the process's CPU time, and its memory (RSS) before the run, at every tenth
  of the items and at its peak.
- ``build STORE N C RUN_ID``: the same map, stopped by the item at N/2 (the items in flight
  drain, then it suspends): the store a resume starts from.
- ``resume STORE RUN_ID``: ``kx.configure(store=...)`` (not yet open), then the clock
  starts right before ``kx.resume``; it stops when the first new item's body starts.
  Exits there (the copy of the store is thrown away).

Prints one JSON line of ``time.perf_counter()`` readings and figures.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any


def rss_mb() -> float:
    """This process's resident memory now (MiB)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return peak_mb()


def peak_mb() -> float:
    """This process's peak resident memory so far (MiB; Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def _emit(out: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def _run(path: str, n: int, concurrency: int, run_id: str | None, stop_at: int | None) -> None:
    import kernelext as kx

    from . import batch_agents

    store = kx.open_store(path)
    kx.sql("SELECT 1", store=store)  # pandas imported, the store warm
    before = rss_mb()
    tenth = max(1, n // 10)
    samples: list[list[float]] = []

    def sample(i: int) -> None:
        if i % tenth == 0:
            samples.append([i, rss_mb()])

    batch_agents.ON_ITEM.append(sample)
    if stop_at is not None:
        batch_agents.STOP_AT[:] = [stop_at]
    cpu0, t0 = time.process_time(), time.perf_counter()
    handle = batch_agents.big_agent.start(n, concurrency, run_id=run_id, store=store)
    status = handle.wait()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    expected = "suspended" if stop_at is not None else "completed"
    if status != expected:
        raise SystemExit(f"big map ended {status}: {handle.error}")
    done = int(
        store.read(
            "SELECT count(*) FROM steps WHERE run_id = ? AND status = 'completed'",
            (handle.run_id,),
        )[0][0]
    )
    store.close()
    _emit(
        {
            "run_id": handle.run_id,
            "items": n,
            "done": done,
            "wall_s": wall,
            "cpu_s": cpu,
            "rss_before_mb": before,
            "rss_samples_mb": samples,
            "peak_rss_mb": peak_mb(),
        }
    )


def _resume(path: str, run_id: str) -> None:
    import duckdb  # noqa: F401 - kernelext imports it lazily; count it as import time

    import kernelext as kx

    from . import batch_agents

    marks: dict[str, Any] = {"imported_rss_mb": rss_mb()}

    def on_item(i: int) -> None:
        marks["first_item"] = time.perf_counter()
        marks["item"] = i
        marks["rss_mb"] = rss_mb()
        marks["peak_rss_mb"] = peak_mb()
        _emit(marks)
        os._exit(0)

    batch_agents.ON_ITEM.append(on_item)
    kx.configure(store=path)  # what KERNELEXT_STORE does; the store opens inside kx.resume
    marks["t0"] = time.perf_counter()
    handle = kx.resume(run_id)
    status = handle.wait(300)
    _emit({"error": f"no new item ran; the run is {status}"})
    os._exit(1)


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "full":
        _run(argv[1], int(argv[2]), int(argv[3]), None, None)
    elif mode == "build":
        n = int(argv[2])
        _run(argv[1], n, int(argv[3]), argv[4], n // 2)
    elif mode == "resume":
        _resume(argv[1], argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}: full, build or resume")


if __name__ == "__main__":
    main(sys.argv[1:])
