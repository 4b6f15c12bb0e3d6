"""Stop → ``suspended`` while another process holds the store file (part of ``features``).

A run takes short steps (2 ms); ``h.stop()`` then ``h.wait()`` is timed while another
process holds the DuckDB file (``tests/support/store_holder.py``: its connection open, as
during a long ``kx.sql`` there), against the same stop with the file free, interleaved.
The suspension is one journaled ``run_end`` record (``kernelext/_store/run_end.py``), so
the wait does not include the other process's hold; ``to_tables_ms`` is how long after that
process is told to let go the suspension is in the tables (``store.flush()`` returned),
which includes its closing the store.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import kernelext as kx
from kernelext._core.lifecycle.run import engine_of
from kernelext.status import Status

from .common import Plan, settle, summarize, tempdir

__all__ = ["measure_held_stop"]

WAIT_S = 120.0
STEPS_BEFORE = 20  # steps completed before the stop


@kx.agent(name="bench_held_stop")
def short_steps(run: kx.Run) -> None:
    for _ in run.steps(range(100_000)):  # bounded: about 4 minutes
        time.sleep(0.002)


def _running(store: Any) -> Any:
    handle = short_steps.start(run_id=f"held-stop-{uuid.uuid4().hex[:8]}", store=store)
    deadline = time.perf_counter() + WAIT_S
    while len(engine_of(handle.run).completed) < STEPS_BEFORE:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"held_stop: {handle.run_id} did not reach {STEPS_BEFORE} steps")
        time.sleep(0.005)
    return handle


def _stop(handle: Any) -> float:
    t0 = time.perf_counter()
    handle.stop(source="bench")
    status = handle.wait(WAIT_S)
    elapsed = (time.perf_counter() - t0) * 1000.0
    if status != Status.SUSPENDED:
        raise RuntimeError(f"held_stop: {handle.run_id} ended {status}: {handle.error}")
    return elapsed


def measure_held_stop(plan: Plan) -> dict[str, Any]:
    from support.store_holder import hold_store  # tests/support (``features._support``)

    reps = 3 if plan.quick else 5
    laps: dict[str, list[float]] = {"held": [], "free": [], "to_tables": []}
    with tempdir("features-held-stop") as folder:
        path = os.path.join(folder, "kx.duckdb")
        store = kx.open_store(path)
        store.backend.wait_timeout = WAIT_S
        try:
            for _ in range(reps):
                handle = _running(store)
                holder = hold_store(path)
                try:
                    settle()
                    laps["held"].append(_stop(handle))
                    if not holder.running:
                        raise RuntimeError("held_stop: the holder let go before the stop")
                    released = time.perf_counter()
                    holder.send("release")
                    store.flush()  # the fold, once the holder let go
                    laps["to_tables"].append((time.perf_counter() - released) * 1000.0)
                    holder.expect("released")
                finally:
                    holder.close()
                if store.get_run(handle.run_id)["status"] != Status.SUSPENDED:
                    raise RuntimeError(f"held_stop: {handle.run_id} not suspended in the tables")
                handle = _running(store)
                settle()
                laps["free"].append(_stop(handle))
        finally:
            store.close()
    return {
        "reps": reps,
        "held_stop_ms": summarize(laps["held"]),
        "free_stop_ms": summarize(laps["free"]),
        "to_tables_ms": summarize(laps["to_tables"]),
    }
