"""``python -m benchmarks profile TOPIC``: cProfile every thread of a kernelext workload.

kernelext does its work in three threads (the caller, the run's worker, the store's
writer), so one cProfile per thread is started through ``threading.setprofile``.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .common import KB, MB, Plan, tempdir

__all__ = ["TOPICS", "profile_topic"]


def _profile_threads(
    fn: Callable[[], Any], cpu: bool = False
) -> list[tuple[str, cProfile.Profile]]:
    """One cProfile per thread; ``cpu``: timed by each thread's CPU clock, not the wall
    clock, so that waiting (a lock, an ``fdatasync`` in flight) counts for nothing."""
    profilers: list[tuple[str, cProfile.Profile]] = []
    lock = threading.Lock()

    def new() -> cProfile.Profile:
        return cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()

    def starter(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        prof = new()
        with lock:
            profilers.append((threading.current_thread().name, prof))
        prof.enable()

    main = new()
    threading.setprofile(starter)
    main.enable()
    try:
        fn()
    finally:
        main.disable()
        threading.setprofile(None)
    return [("main", main), *profilers]


def _steps(folder: str, plan: Plan) -> None:
    from .kx_agents import noop_agent
    from .kx_runs import run_agent

    run_agent(folder, noop_agent, plan.step_count)


def _snapshot(size: int, shape: str) -> Callable[[str, Plan], None]:
    def run(folder: str, plan: Plan) -> None:
        from . import kx_agents
        from .kx_runs import run_agent
        from .snapshots import payloads

        steps = plan.snapshot_steps(size)
        kx_agents.PAYLOADS[:] = payloads(shape, size, steps)
        run_agent(folder, kx_agents.payload_agent, steps)
        kx_agents.PAYLOADS.clear()

    return run


def _effects(folder: str, plan: Plan) -> None:
    from .kx_agents import effects_agent
    from .kx_runs import run_agent

    run_agent(folder, effects_agent, plan.effect_calls, 0.0)


def _resume(folder: str, plan: Plan) -> None:
    from .resume_run import _copy_store, build_resume_store, run_child

    source, _ = build_resume_store(folder, plan.resume_effects)
    os.makedirs(os.path.join(folder, "rep"))
    out = os.path.join(folder, "resume.prof")
    timings = run_child(_copy_store(source, os.path.join(folder, "rep")), profile_out=out)
    print("child timings (ms):", {k: round(v, 1) for k, v in timings.items()})
    stats = pstats.Stats(out)
    stats.sort_stats("cumulative").print_stats(40)


def _batch(concurrency: int) -> Callable[[str, Plan], None]:
    """A ``run.map`` of zero-latency items with one effect each (``benchmarks.batch``)."""

    def run(folder: str, plan: Plan) -> None:
        from .batch import kx_map_e2e
        from .batch_agents import ping_agent

        n = _batch_items(plan)
        result = kx_map_e2e(folder, ping_agent, n, concurrency)
        print(
            f"{n} items at concurrency {concurrency}: {result['total_s'] / n * 1000:.3f} ms "
            f"wall and {result['cpu_s'] / n * 1000:.3f} ms CPU per item (profiled), "
            f"{result['records'] / max(result['syncs'], 1):.1f} records per fdatasync"
        )

    return run


def _batch_items(plan: Plan) -> int:
    return 300 if plan.quick else 3_000


def _batch_split(n: int, concurrency: int) -> None:
    """The same map first without the profiler (whose overhead inflates what it times):
    CPU per item and thread, read from the OS."""
    from .batch import kx_map_e2e
    from .batch_agents import ping_agent
    from .cpu_item import process_cpu_s
    from .thread_cpu import SAMPLER, thread_cpu

    with tempdir("split") as warm:
        kx_map_e2e(warm, ping_agent, 100, concurrency)  # imports, first kx.sql
    with tempdir("split") as split, thread_cpu() as cpu:
        result = kx_map_e2e(split, ping_agent, n, concurrency)
    result["cpu_s"] = process_cpu_s(result, cpu)  # less the sampler's own
    cpu.pop(SAMPLER, None)
    total = sum(cpu.values())
    print(
        f"unprofiled: {n} items at concurrency {concurrency}: "
        f"{result['total_s'] / n * 1000:.3f} ms wall, {result['cpu_s'] / n * 1000:.3f} ms CPU "
        f"per item, {result['records'] / max(result['syncs'], 1):.1f} records per fdatasync"
    )
    for name, seconds in cpu.most_common():
        if seconds * 1000 / n >= 0.001:
            print(f"  {seconds * 1000 / n:7.3f} ms/item {seconds / total:6.1%}  {name}")


TOPICS: dict[str, Callable[[str, Plan], None]] = {
    "steps": _steps,
    "snapshot-1kb-bytes": _snapshot(KB, "bytes"),
    "snapshot-10mb-bytes": _snapshot(10 * MB, "bytes"),
    "snapshot-10mb-arrow": _snapshot(10 * MB, "arrow_table"),
    "snapshot-10mb-json": _snapshot(10 * MB, "json_list_of_str"),
    "effects": _effects,
    "resume": _resume,
    "batch": _batch(32),
    "batch-c1": _batch(1),
}
BATCH_CONCURRENCY = {"batch": 32, "batch-c1": 1}


def profile_topic(topic: str, plan: Plan, limit: int = 25, cpu: bool = False) -> str:
    """Run ``topic`` under per-thread cProfile; return the top functions per thread
    (``cpu``: CPU time of each thread, see ``_profile_threads``)."""
    with tempdir(f"profile-{topic}") as folder:
        if topic == "resume":  # profiled inside its child process (main thread)
            _resume(folder, plan)
            return ""
        if topic in BATCH_CONCURRENCY:  # first unprofiled: CPU per item and thread
            _batch_split(_batch_items(plan), BATCH_CONCURRENCY[topic])
        profiles = _profile_threads(lambda: TOPICS[topic](folder, plan), cpu)
    out = io.StringIO()
    grouped: dict[str, pstats.Stats] = {}
    for name, prof in profiles:  # a pool's threads (name_0, name_1, ...) are added up
        group = re.sub(r"_\d+$", "_*", name)
        if group in grouped:
            grouped[group].add(prof)
        else:
            grouped[group] = pstats.Stats(prof, stream=out)
    for name, stats in grouped.items():
        if stats.total_tt < 0.01:  # type: ignore[attr-defined]
            continue
        out.write(
            f"\n===== thread {name}: {stats.total_tt * 1000:.0f} ms "  # type: ignore[attr-defined]
            f"{'CPU' if cpu else 'wall'} profiled =====\n"
        )
        stats.sort_stats("tottime").print_stats(limit)
        stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()
