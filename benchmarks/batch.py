"""Issue 21, item 8: the write path keeps up with ``run.map``.

Same run, interleaved, medians over repetitions:

- **posts**: N items, one POST each to a local server (``batch_http``, a process of its own)
  that answers after 20 ms, 32 at a time. kernelext: ``run.map`` of one recorded effect
  per item, from ``agent.start()`` until ``kx.sql`` reads the run ``completed`` with N
  steps and N ``applied`` effects. Against a plain ``ThreadPoolExecutor(32)`` making the
  same POSTs with nothing recorded; DBOS (async steps under ``asyncio.gather`` with a
  semaphore of 32, SQLite system database, until the status reads SUCCESS); LangGraph
  (``Send`` fan-out, ``max_concurrency=32``, ``SqliteSaver``, ``durability="sync"``, until
  the final checkpoint holds every result). The server checks each item arrived once.
- **zero latency**: N items of one no-op effect each, 32 at a time against one at a time,
  end to end as above: items per second, the process's CPU time per item, and records
  per ``fdatasync`` (the journal counts its syncs).
- **stop**: a 32-wide map of items taking 20 to 300 ms; once the pool is busy,
  ``h.stop()``, then ``h.wait()`` until ``suspended``. Against the longest item in flight
  at the stop: how long it still ran after ``h.stop()`` (and its whole duration).
- **big map** (child processes): a 100,000-item map of zero-latency items with one effect
  each: peak RSS and RSS along the way; then the same map stopped with 50,000 done, and in
  a new process the time from ``kx.resume`` (the store opened inside it) to the first new
  item's body.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common import Plan, ratio, settle, summarize, tempdir

__all__ = ["BatchSizes", "batch_lines", "measure_batch"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT_S = 600.0
CONCURRENCY = 32
POST_DELAY_S = 0.02
Runner = Callable[[str], dict[str, Any]]


@dataclass
class BatchSizes:
    """How much this topic measures; ``--quick`` (or ``--batch-scale``) makes it smaller."""

    post_items: int
    zero_items: int
    stop_items: int
    big_items: int
    reps: int
    resume_reps: int

    @classmethod
    def of(cls, plan: Plan) -> BatchSizes:
        if plan.quick:
            return cls(200, 200, 200, 800, plan.reps, plan.reps)
        scale = plan.batch_scale
        return cls(
            max(100, int(2_000 * scale)),
            max(100, int(2_000 * scale)),
            max(200, int(2_000 * scale)),
            max(1_000, int(100_000 * scale)),
            plan.reps,
            plan.reps,
        )


# -- kernelext, end to end ----------------------------------------------------------------
def _visible(store: Any, run_id: str, n: int) -> int:
    """Poll ``kx.sql`` until the run reads completed with ``n`` steps and ``n`` applied
    effects; returns the number of reads."""
    import kernelext as kx

    rid = "'" + run_id.replace("'", "''") + "'"
    sql = (
        "SELECT r.status, r.completed_steps, (SELECT count(*) FROM effects e"
        f" WHERE e.run_id = r.id AND e.status = 'applied') FROM runs r WHERE r.id = {rid}"
    )
    deadline = time.perf_counter() + WAIT_S
    reads = 0
    while True:
        reads += 1
        row = kx.sql(sql, store=store).iloc[0]
        if row.iloc[0] == "completed" and int(row.iloc[1]) == n and int(row.iloc[2]) == n:
            return reads
        if time.perf_counter() > deadline:
            raise RuntimeError(f"batch run {run_id} never visible in kx.sql: {list(row)}")
        time.sleep(0.001)


def kx_map_e2e(folder: str, agent: Any, n: int, concurrency: int) -> dict[str, Any]:
    """``agent.start(n, concurrency)`` on a new store until it is visible in ``kx.sql``."""
    from kernelext._store import open_store

    store = open_store(os.path.join(folder, "kx.duckdb"))  # opened outside the clock
    try:
        journal = store.hot_path.journal if store.hot_path is not None else None
        syncs0, seq0 = (journal.syncs, journal.last_seq) if journal else (0, 0)
        cpu0, start = time.process_time(), time.perf_counter()
        handle = agent.start(n, concurrency, store=store)
        status = handle.wait(WAIT_S)
        if status != "completed":
            raise RuntimeError(f"{agent.name} ended {status}: {handle.error}")
        reads = _visible(store, handle.run_id, n)
        total, cpu = time.perf_counter() - start, time.process_time() - cpu0
        out = {"total_s": total, "cpu_s": cpu, "reads": reads}
        if journal is not None:
            out["syncs"] = journal.syncs - syncs0
            out["records"] = journal.last_seq - seq0
        return out
    finally:
        store.close()


# -- 1: POSTs to a server answering in 20 ms ----------------------------------------------
def _plain_posts(folder: str, n: int) -> dict[str, Any]:
    from .batch_http import post

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(post, range(n)))
    total = time.perf_counter() - start
    assert len(results) == n
    return {"total_s": total}


def _post_runners(systems: set[str]) -> dict[str, Callable[[str, int], dict[str, Any]]]:
    from .batch_agents import post_agent

    runners: dict[str, Callable[[str, int], dict[str, Any]]] = {"threads": _plain_posts}
    if "kernelext" in systems:
        runners["kernelext"] = lambda folder, n: kx_map_e2e(folder, post_agent, n, CONCURRENCY)
    if "dbos" in systems:
        from . import rivals_dbos

        runners["dbos"] = lambda folder, n: rivals_dbos.batch_e2e(folder, n, CONCURRENCY)
    if "langgraph" in systems:
        from . import rivals_langgraph

        runners["langgraph_sync"] = lambda folder, n: rivals_langgraph.batch_e2e(
            folder, n, CONCURRENCY
        )
    return runners


def measure_posts(sizes: BatchSizes, systems: set[str]) -> dict[str, Any]:
    from .batch_http import serve, server_stats

    n = sizes.post_items
    runners = _post_runners(systems)
    walls: dict[str, list[float]] = {name: [] for name in runners}
    with serve(POST_DELAY_S):
        for name, runner in runners.items():  # imports, first kx.sql, DBOS launch
            with tempdir(f"batch-warm-{name}") as folder:
                runner(folder, 2 * CONCURRENCY)
        for _ in range(sizes.reps):
            for name, runner in runners.items():
                settle()
                server_stats(reset=True)
                with tempdir(f"batch-posts-{name}") as folder:
                    result = runner(folder, n)
                stats = server_stats()
                if stats["posts"] != n or stats["unique"] != n:
                    raise RuntimeError(f"{name}: {n} items, the server saw {stats}")
                walls[name].append(result["total_s"])
    med = {name: statistics.median(values) for name, values in walls.items()}
    return {
        "items": n,
        "concurrency": CONCURRENCY,
        "server_delay_ms": POST_DELAY_S * 1000,
        "ideal_s": n / CONCURRENCY * POST_DELAY_S,
        "systems": {name: {"wall_s": summarize(values)} for name, values in walls.items()},
        "ratio_to_threads": {name: ratio(med[name], med["threads"]) for name in med},
    }


# -- 2: zero-latency effects, 32 at a time against one at a time --------------------------
def measure_zero_latency(sizes: BatchSizes) -> dict[str, Any]:
    from .batch_agents import ping_agent
    from .cpu_item import process_cpu_s, thread_split
    from .thread_cpu import thread_cpu

    n = sizes.zero_items
    modes = {"c32": CONCURRENCY, "c1": 1}
    per: dict[str, dict[str, list[float]]] = {
        m: {"items_per_s": [], "cpu_ms_per_item": [], "records_per_sync": [], "syncs": []}
        for m in modes
    }
    with tempdir("batch-zero-warm") as folder:
        kx_map_e2e(folder, ping_agent, 2 * CONCURRENCY, CONCURRENCY)
    split: list[dict[str, float]] = []  # c32: CPU ms per item of each thread group
    for _ in range(sizes.reps):
        for mode, concurrency in modes.items():
            settle()
            with tempdir(f"batch-zero-{mode}") as folder, thread_cpu() as cpu:
                result = kx_map_e2e(folder, ping_agent, n, concurrency)
            if mode == "c32":
                split.append(thread_split(cpu, n))
            result["cpu_s"] = process_cpu_s(result, cpu)  # less the sampler's own
            per[mode]["items_per_s"].append(n / result["total_s"])
            per[mode]["cpu_ms_per_item"].append(result["cpu_s"] / n * 1000.0)
            per[mode]["records_per_sync"].append(result["records"] / max(result["syncs"], 1))
            per[mode]["syncs"].append(result["syncs"])
    out: dict[str, Any] = {"items": n, "records_per_item": 4}
    for mode, figures in per.items():
        out[mode] = {name: summarize(values) for name, values in figures.items()}
    out["c32"]["threads_ms_per_item"] = {
        name: statistics.median(run.get(name, 0.0) for run in split)
        for name in sorted({name for run in split for name in run})
    }
    out["speedup"] = ratio(out["c32"]["items_per_s"]["median"], out["c1"]["items_per_s"]["median"])
    return out


# -- 3: a stop with 32 items in flight ------------------------------------------------------
def _stop_once(folder: str, n: int) -> dict[str, float]:
    from kernelext._store import open_store

    from . import batch_agents

    times = batch_agents.ITEM_TIMES
    times.clear()
    store = open_store(os.path.join(folder, "kx.duckdb"))
    try:
        handle = batch_agents.nap_agent.start(n, CONCURRENCY, store=store)
        deadline = time.perf_counter() + WAIT_S
        while len(times) < 3 * CONCURRENCY:  # the pool is busy, items end at any moment
            if time.perf_counter() > deadline or not handle.alive:
                raise RuntimeError(f"stop benchmark: the batch never got busy ({len(times)})")
            time.sleep(0.002)
        t0 = time.perf_counter()
        handle.stop(source="bench")
        asked = time.perf_counter()  # the stop is recorded: no item may start from here
        status = handle.wait(WAIT_S)
        t1 = time.perf_counter()
        if status != "suspended":
            raise RuntimeError(f"stop benchmark: the run is {status}, not suspended")
        flight = {i: t for i, t in list(times.items()) if t[0] <= t0 and (len(t) < 2 or t[1] > t0)}
        late = sum(1 for t in list(times.values()) if t[0] > asked)
        during = sum(1 for t in list(times.values()) if t0 < t[0] <= asked)
        if not flight or any(len(t) < 2 for t in flight.values()):
            raise RuntimeError("stop benchmark: an item in flight never ended")
        last = max(flight, key=lambda i: flight[i][1])
        return {
            "stop_to_suspended_ms": (t1 - t0) * 1000.0,
            "longest_left_ms": (flight[last][1] - t0) * 1000.0,
            "longest_item_ms": (flight[last][1] - flight[last][0]) * 1000.0,
            "overhead_ms": (t1 - flight[last][1]) * 1000.0,
            "in_flight": float(len(flight)),
            "started_after_stop": float(late),
            "started_while_stop_was_asked": float(during),
        }
    finally:
        store.close()


def measure_stop(sizes: BatchSizes) -> dict[str, Any]:
    reps: list[dict[str, float]] = []
    with tempdir("batch-stop-warm") as folder:
        _stop_once(folder, sizes.stop_items)
    for _ in range(sizes.reps):
        settle()
        with tempdir("batch-stop") as folder:
            reps.append(_stop_once(folder, sizes.stop_items))
    return {
        "items": sizes.stop_items,
        "concurrency": CONCURRENCY,
        **{key: summarize([r[key] for r in reps]) for key in reps[0]},
    }


# -- 4: the 100,000-item map, in child processes --------------------------------------------
def _child(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("KERNELEXT_STORE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.batch_child", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    out: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or not out or "error" in out:
        raise RuntimeError(f"batch child {args[0]} failed ({proc.returncode}): {out} "
                           f"{proc.stderr[-3000:]}")  # fmt: skip
    return out


def _copy_store(source: str, target_dir: str) -> str:
    target = os.path.join(target_dir, os.path.basename(source))
    for suffix in ("", ".wal"):
        if os.path.exists(source + suffix):
            shutil.copy(source + suffix, target + suffix)
    if os.path.isdir(source + ".blobs"):
        shutil.copytree(source + ".blobs", target + ".blobs")
    return target


def measure_big(sizes: BatchSizes) -> dict[str, Any]:
    n = sizes.big_items
    with tempdir("batch-big") as folder:
        full = _child("full", os.path.join(folder, "full.duckdb"), str(n), str(CONCURRENCY))
        source = os.path.join(folder, "half.duckdb")
        built = _child("build", source, str(n), str(CONCURRENCY), "bench-batch-big")
        resumes: list[dict[str, float]] = []
        for i in range(sizes.resume_reps):
            settle()
            rep = os.path.join(folder, f"rep{i}")
            os.makedirs(rep)
            marks = _child("resume", _copy_store(source, rep), "bench-batch-big")
            resumes.append(
                {
                    "resume_to_first_item_ms": (marks["first_item"] - marks["t0"]) * 1000.0,
                    "peak_rss_mb": marks["peak_rss_mb"],
                    "imported_rss_mb": marks["imported_rss_mb"],
                }
            )
            shutil.rmtree(rep, ignore_errors=True)
    return {
        "items": n,
        "concurrency": CONCURRENCY,
        "full": {
            "wall_s": full["wall_s"],
            "items_per_s": n / full["wall_s"],
            "cpu_ms_per_item": full["cpu_s"] / n * 1000.0,
            "rss_before_mb": full["rss_before_mb"],
            "peak_rss_mb": full["peak_rss_mb"],
            "rss_samples_mb": full["rss_samples_mb"],
        },
        "resume": {
            "done_before": built["done"],
            "build_wall_s": built["wall_s"],
            **{key: summarize([r[key] for r in resumes]) for key in resumes[0]},
        },
    }


def measure_batch(plan: Plan, systems: set[str]) -> dict[str, Any]:
    sizes = BatchSizes.of(plan)
    out: dict[str, Any] = {"sizes": sizes.__dict__}
    out["posts"] = measure_posts(sizes, systems)
    if "kernelext" in systems:
        out["zero_latency"] = measure_zero_latency(sizes)
        out["stop"] = measure_stop(sizes)
        out["big"] = measure_big(sizes)
    return out


# -- the table ------------------------------------------------------------------------------
def _m(node: dict[str, Any] | None, key: str) -> float | None:
    value = (node or {}).get(key)
    if isinstance(value, dict):
        value = value.get("median")
    return float(value) if isinstance(value, (int, float)) else None


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def batch_lines(batch: dict[str, Any]) -> list[str]:
    """The markdown of the batch topic (``report.markdown`` appends it)."""
    lines = ["", "### Issue 21: batches (`run.map`)", ""]
    posts = batch.get("posts")
    if posts:
        lines += [
            f"{posts['items']:,} items, one POST each to a local server answering in "
            f"{posts['server_delay_ms']:.0f} ms, {posts['concurrency']} at a time "
            f"(ideal {posts['ideal_s']:.2f} s):",
            "",
            "| system | wall (s) | × plain threads |",
            "|---|---|---|",
        ]
        for name, node in posts["systems"].items():
            r = posts["ratio_to_threads"].get(name)
            lines.append(f"| {name} | {_f(_m(node, 'wall_s'), 3)} | {_f(r)} |")
    zero = batch.get("zero_latency")
    if zero:
        lines += [
            "",
            f"{zero['items']:,} zero-latency items, one effect each, end to end:",
            "",
            "| concurrency | items/s | CPU ms/item | records per fdatasync |",
            "|---|---|---|---|",
        ]
        for mode in ("c32", "c1"):
            node = zero[mode]
            lines.append(
                f"| {mode[1:]} | {_f(_m(node, 'items_per_s'), 0)} | "
                f"{_f(_m(node, 'cpu_ms_per_item'), 3)} | {_f(_m(node, 'records_per_sync'))} |"
            )
        lines.append(f"\nSpeed-up, 32 against 1: {_f(zero.get('speedup'))}×")
        split = zero["c32"].get("threads_ms_per_item") or {}
        if split:
            lines.append(
                "\nCPU per item at 32, by thread (median ms): "
                + ", ".join(f"{name} {ms:.3f}" for name, ms in sorted(split.items(),
                                                                   key=lambda kv: -kv[1]))
            )  # fmt: skip
    stop = batch.get("stop")
    if stop:
        lines += [
            "",
            f"Stop with {stop['concurrency']} in flight: h.stop() to suspended "
            f"{_f(_m(stop, 'stop_to_suspended_ms'), 0)} ms; the longest item in flight ran "
            f"{_f(_m(stop, 'longest_left_ms'), 0)} ms after the stop "
            f"({_f(_m(stop, 'longest_item_ms'), 0)} ms in all); suspended "
            f"{_f(_m(stop, 'overhead_ms'), 0)} ms after it ended; "
            f"{_f(_m(stop, 'started_after_stop'), 0)} items started after h.stop() returned "
            f"({_f(_m(stop, 'started_while_stop_was_asked'), 0)} while it was being asked).",
        ]
    big = batch.get("big")
    if big:
        full, res = big["full"], big["resume"]
        lines += [
            "",
            f"{big['items']:,}-item map: {_f(full['items_per_s'], 0)} items/s, "
            f"{_f(full['cpu_ms_per_item'], 3)} ms CPU/item, RSS {_f(full['rss_before_mb'], 0)} "
            f"MiB before, peak {_f(full['peak_rss_mb'], 0)} MiB. Resume with "
            f"{res['done_before']:,} done: kx.resume to the first new item "
            f"{_f(_m(res, 'resume_to_first_item_ms'), 0)} ms (peak RSS "
            f"{_f(_m(res, 'peak_rss_mb'), 0)} MiB).",
        ]
    return lines
