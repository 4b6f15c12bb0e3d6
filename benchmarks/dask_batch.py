"""Issue 23: a batch's items on a Dask cluster, recording into one PostgreSQL ledger.

``python -m benchmarks --only dask`` (``--dask-scale 0.1`` for a tenth of the sizes,
``--quick`` for a smoke run). Everything runs on one throw-away PostgreSQL server started
the way the tests start one (``tests/support/postgres.py``, the server's default
durability: fsync on, synchronous commit), with a ``distributed.LocalCluster`` of 2 worker
processes. Every run, on the cluster or in this process, is ``agent.start(...)`` on the
same PostgreSQL store until ``h.wait()`` returns ``completed`` and ``kx.sql`` reads every
step completed (and every effect ``applied``). Same run, interleaved within each
repetition, medians over repetitions:

- **cpu**: N items of about 200 ms of pure-Python work each (calibrated in this process
  at the start), ``run.map(..., concurrency=4, executor=client)`` on a cluster of 2 worker
  processes with 1 thread each, against ``run.map(..., concurrency=4)`` on threads of this
  process (one GIL). The speed-up is threads / cluster; 2 workers allow 2×.
- **io**: N items, one recorded POST each to a local server answering after 50 ms
  (``benchmarks.batch_http``, a process of its own, counting each item's deliveries),
  64 at a time: on a cluster of 2 worker processes with 32 threads each, against threads
  of this process, against plain ``ThreadPoolExecutor(64)`` POSTs recording nothing.
- **overhead**: N items of one no-op effect each, one at a time (the latency of an item)
  and 8 at a time (throughput): time per item on the cluster against in this process.
  Anchors of the same run: a bare Dask task (``client.submit`` of a no-op, one at a time,
  and ``client.map`` of N), and one PostgreSQL single-row commit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import itertools
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .common import Plan, ratio, settle, summarize

__all__ = ["TARGET_SPEEDUP", "DaskSizes", "measure_dask", "missing"]

TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
WAIT_S = 900.0
WORKERS = 2
CPU_CONCURRENCY = 4
IO_THREADS_PER_WORKER = 32
TARGET_SPEEDUP = 1.7
_RUNS = itertools.count(1)


@dataclass
class DaskSizes:
    """How much this topic measures; ``--quick`` or ``--dask-scale`` makes it smaller."""

    cpu_items: int
    cpu_item_s: float
    io_items: int
    io_concurrency: int
    io_delay_s: float
    overhead_items: int
    reps: int

    @classmethod
    def of(cls, plan: Plan) -> DaskSizes:
        if plan.quick:
            return cls(12, 0.2, 128, 64, 0.05, 40, plan.reps)
        scale = plan.dask_scale
        return cls(
            max(8, int(400 * scale)),
            0.2,
            max(64, int(1_280 * scale)),
            64,
            0.05,
            max(20, int(400 * scale)),
            min(plan.reps, 3),
        )


def missing() -> str | None:
    """Why this topic cannot run here, or None."""
    for module in ("distributed", "cloudpickle", "psycopg"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install -e '.[dask]'"
    sys.path.insert(0, TESTS_DIR)
    from support.postgres import find_postgres_bin

    if find_postgres_bin() is None:
        return "PostgreSQL is not installed (no initdb): apt-get install postgresql"
    return None


@contextlib.contextmanager
def _cluster(threads_per_worker: int) -> Iterator[tuple[Any, float]]:
    """A LocalCluster of 2 worker processes and its client; yields (client, start seconds)."""
    from distributed import Client, LocalCluster

    start = time.perf_counter()
    with (
        LocalCluster(
            n_workers=WORKERS,
            processes=True,
            threads_per_worker=threads_per_worker,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(WORKERS)
        from .dask_agents import EXECUTOR

        EXECUTOR[:] = [client]
        try:
            yield client, time.perf_counter() - start
        finally:
            EXECUTOR.clear()


# -- one run, end to end ------------------------------------------------------------------
def _visible(store: Any, run_id: str, steps: int, applied: int) -> None:
    """Poll ``kx.sql`` until the run reads completed with every step and effect recorded."""
    import kernelext as kx

    rid = "'" + run_id.replace("'", "''") + "'"
    sql = (
        "SELECT r.status, (SELECT count(*) FROM steps s WHERE s.run_id = r.id AND"
        " s.status = 'completed'), (SELECT count(*) FROM effects e WHERE e.run_id = r.id"
        f" AND e.status = 'applied') FROM runs r WHERE r.id = {rid}"
    )
    deadline = time.perf_counter() + WAIT_S
    while True:
        row = kx.sql(sql, store=store).iloc[0]
        if row.iloc[0] == "completed" and int(row.iloc[1]) >= steps and int(row.iloc[2]) == applied:
            return
        if time.perf_counter() > deadline:
            raise RuntimeError(f"dask run {run_id} never visible in kx.sql: {list(row)}")
        time.sleep(0.005)


def _timed(store: Any, agent: Any, args: tuple[Any, ...], n: int, effects: int) -> float:
    """Seconds from ``agent.start(*args)`` to the run completed and visible in ``kx.sql``."""
    run_id = f"{agent.name}-{os.getpid()}-{next(_RUNS)}"
    start = time.perf_counter()
    handle = agent.start(*args, store=store, run_id=run_id)
    status = handle.wait(WAIT_S)
    if status != "completed":
        raise RuntimeError(f"{run_id} ended {status}: {handle.error!r}")
    _visible(store, run_id, n, effects)
    return time.perf_counter() - start


def _interleaved(
    reps: int, runners: dict[str, Callable[[], float]], check: Callable[[str], None] | None = None
) -> dict[str, list[float]]:
    walls: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(reps):
        for name, runner in runners.items():
            settle()
            walls[name].append(runner())
            if check is not None:
                check(name)
    return walls


# -- a: CPU-bound items --------------------------------------------------------------------
def measure_cpu(store: Any, client: Any, sizes: DaskSizes) -> dict[str, Any]:
    from . import dask_agents as agents

    n = sizes.cpu_items
    loops = agents.loops_for(sizes.cpu_item_s)
    one = statistics.median(_item_seconds(agents.spin, loops) for _ in range(3))
    for remote in (True, False):  # imports, the workers' stores, first statements
        _timed(store, agents.cpu_agent, (WORKERS, 1, CPU_CONCURRENCY, remote), WORKERS, 0)
    runners = {
        "cluster": lambda: _timed(store, agents.cpu_agent, (n, loops, CPU_CONCURRENCY, True), n, 0),
        "threads": lambda: _timed(
            store, agents.cpu_agent, (n, loops, CPU_CONCURRENCY, False), n, 0
        ),
        "dask_bare": lambda: _bare_map(client, agents.spin, loops, n),
    }
    walls = _interleaved(sizes.reps, runners)
    med = {name: statistics.median(values) for name, values in walls.items()}
    return {
        "items": n,
        "item_s": one,
        "loops": loops,
        "concurrency": CPU_CONCURRENCY,
        "workers": WORKERS,
        "threads_per_worker": 1,
        "ideal_cluster_s": n * one / WORKERS,
        "ideal_threads_s": n * one,
        "systems": {name: {"wall_s": summarize(values)} for name, values in walls.items()},
        "speedup": ratio(med["threads"], med["cluster"]),
        "speedup_dask_bare": ratio(med["threads"], med["dask_bare"]),
    }


def _bare_map(client: Any, spin: Callable[..., int], loops: int, n: int) -> float:
    """The same work as a plain ``client.map`` on the same cluster, nothing recorded: what
    this machine gives two worker processes at the moment."""
    import functools

    start = time.perf_counter()
    futures = client.map(functools.partial(spin, loops), range(n), pure=False)
    assert len(client.gather(futures)) == n
    return time.perf_counter() - start


def _item_seconds(spin: Callable[[int], int], loops: int) -> float:
    start = time.perf_counter()
    spin(loops)
    return time.perf_counter() - start


# -- b: I/O-bound items, 64 at a time -------------------------------------------------------
def measure_io(store: Any, client: Any, sizes: DaskSizes) -> dict[str, Any]:
    from . import batch_http
    from . import dask_agents as agents

    n, width = sizes.io_items, sizes.io_concurrency
    with batch_http.serve(sizes.io_delay_s) as port:

        def plain() -> float:
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(width) as pool:
                assert len(list(pool.map(batch_http.post, range(n)))) == n
            return time.perf_counter() - start

        def kx_run(remote: bool, items: int = n) -> float:
            return _timed(store, agents.post_agent, (items, port, width, remote), items, items)

        for remote in (True, False):
            kx_run(remote, 2 * width)
        batch_http.server_stats(reset=True)

        def check(name: str) -> None:
            stats = batch_http.server_stats()
            batch_http.server_stats(reset=True)
            if stats["posts"] != n or stats["unique"] != n:
                raise RuntimeError(f"io {name}: {n} items, the server saw {stats}")

        runners = {
            "cluster": lambda: kx_run(True),
            "in_process": lambda: kx_run(False),
            "plain_threads": plain,
        }
        walls = _interleaved(sizes.reps, runners, check)
    med = {name: statistics.median(values) for name, values in walls.items()}
    return {
        "items": n,
        "concurrency": width,
        "server_delay_ms": sizes.io_delay_s * 1000.0,
        "workers": WORKERS,
        "threads_per_worker": IO_THREADS_PER_WORKER,
        "ideal_s": n / width * sizes.io_delay_s,
        "systems": {name: {"wall_s": summarize(values)} for name, values in walls.items()},
        "ratio_to_plain_threads": {name: ratio(med[name], med["plain_threads"]) for name in med},
        "cluster_to_in_process": ratio(med["cluster"], med["in_process"]),
    }


# -- c: what recording an item from a worker costs ------------------------------------------
def _noop(i: int) -> int:
    return i


def _dask_task_ms(client: Any, n: int, one_at_a_time: bool) -> float:
    """A bare Dask task of a no-op: ms per task, one at a time or ``client.map`` of ``n``."""
    start = time.perf_counter()
    if one_at_a_time:
        for i in range(n):
            client.submit(_noop, i, pure=False).result()
    else:
        assert len(client.gather(client.map(_noop, range(n), pure=False))) == n
    return (time.perf_counter() - start) * 1000.0 / n


def measure_overhead(store: Any, client: Any, url: str, sizes: DaskSizes) -> dict[str, Any]:
    from . import dask_agents as agents
    from .postgres_bench import commit_anchor_ms

    n = sizes.overhead_items
    for remote in (True, False):
        _timed(store, agents.ping_agent, (8, 8, remote), 8, 8)
    _dask_task_ms(client, 20, True)

    def per_item(concurrency: int, remote: bool) -> Callable[[], float]:
        args = (n, concurrency, remote)
        return lambda: _timed(store, agents.ping_agent, args, n, n) * 1000.0 / n

    runners = {
        "cluster_c1": per_item(1, True),
        "in_process_c1": per_item(1, False),
        "cluster_c8": per_item(8, True),
        "in_process_c8": per_item(8, False),
        "dask_task_c1": lambda: _dask_task_ms(client, n, True),
        "dask_task_map": lambda: _dask_task_ms(client, n, False),
    }
    per = _interleaved(sizes.reps, runners)
    med = {name: statistics.median(values) for name, values in per.items()}
    pg_commit = commit_anchor_ms(url, 200)
    return {
        "items": n,
        "pg_commit_ms": pg_commit,
        "ms_per_item": {name: summarize(values) for name, values in per.items()},
        "cluster_to_in_process": {
            c: ratio(med[f"cluster_{c}"], med[f"in_process_{c}"]) for c in ("c1", "c8")
        },
        "cluster_c1_beyond_dask_task_ms": med["cluster_c1"] - med["dask_task_c1"],
        "in_process_c1_in_pg_commits": ratio(med["in_process_c1"], pg_commit),
    }


# -- the topic ------------------------------------------------------------------------------
def measure_dask(plan: Plan) -> dict[str, Any]:
    reason = missing()
    if reason is not None:
        return {"skipped": reason}
    from support.postgres import PostgresServer

    from kernelext._store import open_store

    sizes = DaskSizes.of(plan)
    out: dict[str, Any] = {"sizes": sizes.__dict__, "workers": WORKERS}
    env_store = os.environ.pop("KERNELEXT_STORE", None)  # the workers use the run's URL
    try:
        with PostgresServer(fsync=True) as server:
            url = server.create_database("kx_dask_bench")
            store = open_store(url)
            try:
                with _cluster(1) as (client, started_s):
                    out["cluster_start_s"] = started_s
                    out["cpu"] = measure_cpu(store, client, sizes)
                    out["overhead"] = measure_overhead(store, client, url, sizes)
                with _cluster(IO_THREADS_PER_WORKER) as (client, _):
                    out["io"] = measure_io(store, client, sizes)
            finally:
                store.close()
    finally:
        if env_store is not None:
            os.environ["KERNELEXT_STORE"] = env_store
    return out
