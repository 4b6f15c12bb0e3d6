"""Issue 3: critical-path overhead per effect call.

The agent times each call of a recorded effect whose body is a trivial function;
the overhead is that wall time minus the bare function's. kernelext makes the
intent durable before the call; LangGraph (a task, SqliteSaver, durability="sync")
and DBOS (a step, SQLite) record the outcome after it.

Two patterns: ``back_to_back`` (calls with nothing in between: kernelext's queued
outcome commit of call k is still in the writer when call k+1 asks for its intent)
and ``spaced`` (the agent does a few ms of other work between calls, untimed).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .common import Plan, settle, summarize, tempdir

__all__ = ["measure_effects"]

Runner = Callable[[str, int, float], list[float]]


def _bare_ms(calls: int) -> list[float]:
    from .kx_agents import bare_call

    out = []
    for i in range(calls):
        start = time.perf_counter()
        bare_call(i)
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def _kernelext(folder: str, calls: int, spacing_s: float) -> list[float]:
    from .kx_agents import effects_agent
    from .kx_runs import run_agent

    return [m * 1000.0 for m in run_agent(folder, effects_agent, calls, spacing_s)]


def _runners(systems: set[str]) -> dict[str, Runner]:
    runners: dict[str, Runner] = {}
    if "kernelext" in systems:
        runners["kernelext"] = _kernelext
    if "langgraph" in systems:
        from . import rivals_langgraph

        runners["langgraph_task_sync"] = rivals_langgraph.effect_calls_ms
    if "dbos" in systems:
        from . import rivals_dbos

        runners["dbos_step"] = rivals_dbos.effect_calls_ms
    return runners


def measure_effects(plan: Plan, systems: set[str]) -> dict[str, Any]:
    calls = plan.effect_calls
    modes = {"back_to_back": 0.0, "spaced": plan.effect_spacing_s}
    runners = _runners(systems)
    call_reps: dict[str, dict[str, list[float]]] = {
        mode: {name: [] for name in runners} for mode in modes
    }
    bare_reps: list[float] = []
    for _ in range(plan.reps):
        bare_reps.append(statistics.median(_bare_ms(calls)))
        for mode, spacing in modes.items():
            for name, runner in runners.items():
                settle()
                with tempdir(f"effects-{name}") as folder:
                    times = runner(folder, calls, spacing)
                call_reps[mode][name].append(statistics.median(times))
    bare = statistics.median(bare_reps)
    result: dict[str, Any] = {
        "calls_per_rep": calls,
        "spacing_s": plan.effect_spacing_s,
        "bare_call_ms": summarize(bare_reps, calls * plan.reps),
        "modes": {},
    }
    for mode in modes:
        result["modes"][mode] = {
            name: {
                "call_ms": summarize(values, calls * plan.reps),
                "overhead_ms": statistics.median(values) - bare,
            }
            for name, values in call_reps[mode].items()
        }
    return result
