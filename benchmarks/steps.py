"""Issue 2: per-step overhead of a durable no-op step with a small state.

Each system runs ``n`` steps whose body only records a timestamp; the time between
two consecutive bodies is what the framework costs per step (persisting the step
and its state durably, then starting the next one).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, Literal

from .common import Plan, deltas_ms, settle, summarize, tempdir

__all__ = ["measure_steps"]


def _kernelext(n: int) -> Callable[[str], list[float]]:
    from .kx_agents import noop_agent
    from .kx_runs import run_agent

    return lambda folder: run_agent(folder, noop_agent, n)


def _langgraph(n: int, durability: Literal["sync", "async"]) -> Callable[[str], list[float]]:
    from . import rivals_langgraph

    return lambda folder: rivals_langgraph.steps_marks(folder, n, durability)


def _dbos(n: int) -> Callable[[str], list[float]]:
    from . import rivals_dbos

    return lambda folder: rivals_dbos.steps_marks(folder, n)


def measure_steps(plan: Plan, systems: set[str]) -> dict[str, Any]:
    n = plan.step_count
    runners: dict[str, Callable[[str], list[float]]] = {}
    if "kernelext" in systems:
        runners["kernelext"] = _kernelext(n)
    if "langgraph" in systems:
        runners["langgraph_sync"] = _langgraph(n, "sync")
        runners["langgraph_async"] = _langgraph(n, "async")
    if "dbos" in systems:
        runners["dbos"] = _dbos(n)
    medians: dict[str, list[float]] = {name: [] for name in runners}
    means: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(plan.reps):
        for name, runner in runners.items():  # interleaved: drift hits every system alike
            settle()
            with tempdir(name) as folder:
                marks = runner(folder)
            steps = deltas_ms(marks)
            medians[name].append(statistics.median(steps))
            means[name].append(sum(steps) / len(steps))
    return {
        "n_steps": n,
        "state": "one small int changed every step",
        "systems": {
            name: {
                "per_step_ms": summarize(medians[name], (n - 1) * plan.reps),
                "mean_per_step_ms": summarize(means[name]),
            }
            for name in runners
        },
    }
