"""DBOS Transact with a SQLite system database, as its docs set it up.

Imported only when the DBOS benchmarks run: importing it registers the workflows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from dbos import DBOS, SetWorkflowID

from .common import MARKS
from .kx_agents import bare_call

__all__ = [
    "batch_e2e",
    "effect_calls_ms",
    "effects_e2e",
    "steps_e2e",
    "steps_marks",
    "version",
]


def version() -> str:
    from importlib.metadata import version as dist_version

    return f"dbos {dist_version('dbos')} (SQLite system database)"


@DBOS.step()
def noop_step(i: int) -> int:
    MARKS.append(time.perf_counter())
    return i


@DBOS.workflow()
def steps_workflow(n: int) -> int:
    for i in range(n):
        noop_step(i)
    return n


@DBOS.step()
def ping_step(i: int) -> dict[str, Any]:
    return bare_call(i)


@DBOS.workflow()
def effects_workflow(calls: int, spacing_s: float) -> int:
    for i in range(calls):
        if spacing_s:
            time.sleep(spacing_s)
        start = time.perf_counter()
        ping_step(i)
        MARKS.append(time.perf_counter() - start)
    return calls


@DBOS.workflow()
def effects_only_workflow(calls: int) -> int:
    for i in range(calls):
        ping_step(i)
        MARKS.append(time.perf_counter())
    return calls


@contextlib.contextmanager
def launched(folder: str) -> Iterator[None]:
    url = "sqlite:///" + os.path.join(folder, "dbos.sqlite")
    DBOS(config={"name": "kxbench", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy()
        logging.getLogger("dbos").setLevel(logging.WARNING)


def steps_marks(folder: str, n: int) -> list[float]:
    """One workflow running ``n`` no-op steps; returns the step bodies' timestamps."""
    with launched(folder):
        MARKS.clear()
        steps_workflow(n)
        return list(MARKS)


def effect_calls_ms(folder: str, calls: int, spacing_s: float) -> list[float]:
    """One workflow making ``calls`` step calls; returns the wall time of each (ms)."""
    with launched(folder):
        MARKS.clear()
        effects_workflow(calls, spacing_s)
        return [m * 1000.0 for m in MARKS]


def _until_success(workflow_id: str) -> int:
    """Read the workflow's status row until it says SUCCESS; returns the number of reads."""
    reads = 0
    while True:
        reads += 1
        status = DBOS.get_workflow_status(workflow_id)
        if status is not None and status.status == "SUCCESS":
            return reads
        if reads >= 10_000:
            raise RuntimeError(f"DBOS: workflow {workflow_id} never readable as SUCCESS")
        time.sleep(0.001)


def _e2e(folder: str, workflow: Any, *args: Any) -> dict[str, Any]:
    with launched(folder):  # launching DBOS is set-up, outside the clock
        MARKS.clear()
        workflow_id = f"kxbench-{uuid.uuid4().hex[:8]}"
        start = time.perf_counter()
        with SetWorkflowID(workflow_id):
            workflow(*args)
        reads = _until_success(workflow_id)
        total = time.perf_counter() - start
        return {"total_s": total, "marks": list(MARKS), "reads": reads}


def steps_e2e(folder: str, n: int) -> dict[str, Any]:
    """A workflow of ``n`` no-op steps, until its status reads SUCCESS."""
    return _e2e(folder, steps_workflow, n)


def effects_e2e(folder: str, calls: int) -> dict[str, Any]:
    """A workflow of ``calls`` step calls, until its status reads SUCCESS."""
    return _e2e(folder, effects_only_workflow, calls)


# -- batch: async steps under asyncio.gather, a semaphore of ``concurrency`` --------------
@DBOS.step()
async def post_step(i: int) -> dict[str, Any]:
    from .batch_http import apost

    return await apost(i)


@DBOS.workflow()
async def batch_workflow(n: int, concurrency: int) -> int:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> dict[str, Any]:
        async with gate:
            return await post_step(i)

    results = await asyncio.gather(*(one(i) for i in range(n)))
    return len(results)


def batch_e2e(folder: str, n: int, concurrency: int) -> dict[str, Any]:
    """``n`` POSTs as async steps of one workflow, until its status reads SUCCESS."""
    with launched(folder):  # launching DBOS is set-up, outside the clock
        workflow_id = f"kxbench-batch-{uuid.uuid4().hex[:8]}"

        async def main() -> int:
            with SetWorkflowID(workflow_id):
                return await batch_workflow(n, concurrency)

        start = time.perf_counter()
        done = asyncio.run(main())
        reads = _until_success(workflow_id)
        total = time.perf_counter() - start
        if done != n:
            raise RuntimeError(f"DBOS batch returned {done} results for {n} items")
        return {"total_s": total, "reads": reads}
