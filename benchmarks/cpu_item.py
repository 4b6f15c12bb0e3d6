"""``python -m benchmarks cpu``: the CPU one recorded item costs, every thread counted (issue 35).

A ``run.map`` of zero-latency items with one recorded effect each (``batch_agents.ping_agent``),
32 at a time by default, on a new store per repetition, from ``agent.start()`` until ``kx.sql``
reads the run completed with every effect applied (``batch.kx_map_e2e``). Per item: the
process's CPU time (``time.process_time``: user + system of every thread, DuckDB's included,
less the sampler's own) and its split by thread (``thread_cpu``, read from ``/proc``,
nothing profiled). The machine
may be shared: CPU time, not wall time, is the figure, and the load average is kept beside each
repetition. The same figure, 32 at a time, is the batch topic's ``zero_latency`` row.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from typing import Any

from .common import settle, summarize, tempdir

__all__ = ["cpu_lines", "cpu_per_item", "process_cpu_s", "thread_split"]

TARGET_MS = 0.6  # issue 35: CPU per recorded item, every thread counted


def thread_split(cpu: Counter[str], n: int) -> dict[str, float]:
    """CPU ms per item of each thread group that spent at least 1 µs per item (the
    sampler's own left out)."""
    from .thread_cpu import SAMPLER

    return {
        name: seconds * 1000.0 / n
        for name, seconds in cpu.most_common()
        if seconds * 1e6 >= n and name != SAMPLER
    }


def process_cpu_s(result: dict[str, Any], cpu: Counter[str]) -> float:
    """The process's CPU seconds of a measured block, less the sampler's own."""
    from .thread_cpu import SAMPLER

    return float(result["cpu_s"]) - cpu.get(SAMPLER, 0.0)


def cpu_per_item(n: int, concurrency: int, reps: int) -> dict[str, Any]:
    """``reps`` maps of ``n`` items, ``concurrency`` at a time, after one to warm up."""
    from .batch import kx_map_e2e
    from .batch_agents import ping_agent
    from .thread_cpu import thread_cpu

    with tempdir("cpu-warm") as folder:  # imports, the first kx.sql
        kx_map_e2e(folder, ping_agent, 2 * concurrency, concurrency)
    runs: list[dict[str, Any]] = []
    for _ in range(reps):
        settle()
        load = os.getloadavg()[0]
        with tempdir("cpu") as folder, thread_cpu() as cpu:
            result = kx_map_e2e(folder, ping_agent, n, concurrency)
        runs.append(
            {
                "cpu_ms_per_item": process_cpu_s(result, cpu) / n * 1000.0,
                "wall_ms_per_item": result["total_s"] / n * 1000.0,
                "records_per_sync": result["records"] / max(result["syncs"], 1),
                "threads_ms_per_item": thread_split(cpu, n),
                "loadavg_1m": load,
            }
        )
    names = sorted({name for run in runs for name in run["threads_ms_per_item"]})
    return {
        "items": n,
        "concurrency": concurrency,
        "target_ms": TARGET_MS,
        **{
            key: summarize([run[key] for run in runs])
            for key in ("cpu_ms_per_item", "wall_ms_per_item", "records_per_sync", "loadavg_1m")
        },
        "threads_ms_per_item": {
            name: statistics.median(run["threads_ms_per_item"].get(name, 0.0) for run in runs)
            for name in names
        },
        "runs": runs,
    }


def cpu_lines(result: dict[str, Any]) -> str:
    """The figures as text: medians, each repetition, and the split by thread."""
    cpu, wall = result["cpu_ms_per_item"], result["wall_ms_per_item"]
    load = result["loadavg_1m"]
    lines = [
        f"{result['items']:,} zero-latency items, one recorded effect each, "
        f"{result['concurrency']} at a time, {cpu['reps']} repetitions:",
        f"  CPU per item, every thread: median {cpu['median']:.3f} ms (min {cpu['min']:.3f}, "
        f"max {cpu['max']:.3f}; target <= {result['target_ms']} ms)",
        f"  wall per item: median {wall['median']:.3f} ms; records per fdatasync: "
        f"{result['records_per_sync']['median']:.1f}; load average (1 min) "
        f"{load['min']:.2f} to {load['max']:.2f}",
        "  each repetition, CPU ms per item: "
        + ", ".join(f"{run['cpu_ms_per_item']:.3f}" for run in result["runs"]),
        "  by thread (median ms per item):",
    ]
    for name, ms in sorted(result["threads_ms_per_item"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {ms:7.3f}  {name}")
    return "\n".join(lines)
