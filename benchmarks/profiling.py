"""``python -m benchmarks profile TOPIC``: cProfile every thread of a kernelext workload.

kernelext does its work in three threads (the caller, the run's worker, the store's
writer), so one cProfile per thread is started through ``threading.setprofile``.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import threading
from collections.abc import Callable
from typing import Any

from .common import KB, MB, Plan, tempdir

__all__ = ["TOPICS", "profile_topic"]


def _profile_threads(fn: Callable[[], Any]) -> list[tuple[str, cProfile.Profile]]:
    profilers: list[tuple[str, cProfile.Profile]] = []
    lock = threading.Lock()

    def starter(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        prof = cProfile.Profile()
        with lock:
            profilers.append((threading.current_thread().name, prof))
        prof.enable()

    main = cProfile.Profile()
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


TOPICS: dict[str, Callable[[str, Plan], None]] = {
    "steps": _steps,
    "snapshot-1kb-bytes": _snapshot(KB, "bytes"),
    "snapshot-10mb-bytes": _snapshot(10 * MB, "bytes"),
    "snapshot-10mb-arrow": _snapshot(10 * MB, "arrow_table"),
    "snapshot-10mb-json": _snapshot(10 * MB, "json_list_of_str"),
    "effects": _effects,
    "resume": _resume,
}


def profile_topic(topic: str, plan: Plan, limit: int = 25) -> str:
    """Run ``topic`` under per-thread cProfile; return the top functions per thread."""
    with tempdir(f"profile-{topic}") as folder:
        if topic == "resume":  # profiled inside its child process (main thread)
            _resume(folder, plan)
            return ""
        profiles = _profile_threads(lambda: TOPICS[topic](folder, plan))
    out = io.StringIO()
    for name, prof in profiles:
        stats = pstats.Stats(prof, stream=out)
        if stats.total_tt < 0.01:  # type: ignore[attr-defined]
            continue
        out.write(
            f"\n===== thread {name}: {stats.total_tt * 1000:.0f} ms profiled "  # type: ignore[attr-defined]
            "=====\n"
        )
        stats.sort_stats("tottime").print_stats(limit)
        stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()
