"""The agents, items and effects of the Dask benchmark (``benchmarks.dask_batch``).

In a module of their own, importable by name, so that Dask's worker processes find the
same functions the notebook's process sends them (cloudpickle sends module-level
functions by reference).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import kernelext as kx

from .batch_http import post_to

__all__ = [
    "EXECUTOR",
    "cpu_agent",
    "loops_for",
    "ping_agent",
    "post_agent",
    "spin",
]

# The executor of the runs measured "on the cluster" (a ``distributed.Client``); the agents
# take a flag, not the client, since a run's arguments are stored by value.
EXECUTOR: list[Any] = []


def spin(loops: int, i: int = 0) -> int:
    """Pure-Python work that holds the GIL all along: ``loops`` rounds of integer arithmetic."""
    x = i
    for j in range(loops):
        x = (x * 31 + j) % 1_000_003
    return x


def loops_for(seconds: float) -> int:
    """How many rounds of ``spin`` take ``seconds`` here: a short probe, then the whole
    length timed (best of 3) and scaled once more."""
    probe = 200_000
    loops = max(1, int(probe * seconds / min(_time(probe) for _ in range(3))))
    return max(1, int(loops * seconds / min(_time(loops) for _ in range(3))))


def _time(loops: int) -> float:
    start = time.perf_counter()
    spin(loops)
    return time.perf_counter() - start


def _executor(remote: bool) -> Any:
    return EXECUTOR[0] if remote else None


@kx.agent(name="bench_dask_cpu")
def cpu_agent(run: kx.Run, n: int, loops: int, concurrency: int, remote: bool) -> None:
    """``n`` items of ``loops`` rounds of ``spin`` each; no effect."""
    run.map(
        functools.partial(spin, loops),
        range(n),
        concurrency=concurrency,
        executor=_executor(remote),
    )


@kx.effect
def deliver(port: int, i: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    """POST item ``i`` to the local delivery server (``benchmarks.batch_http``)."""
    return post_to(port, i, idempotency_key)


def post_one(port: int, i: int) -> bool:
    return bool(deliver(port, i)["ok"])


@kx.agent(name="bench_dask_post")
def post_agent(run: kx.Run, n: int, port: int, concurrency: int, remote: bool) -> None:
    """``n`` items, one recorded POST each."""
    run.map(
        functools.partial(post_one, port),
        range(n),
        concurrency=concurrency,
        executor=_executor(remote),
    )


@kx.effect
def ping(i: int, *, idempotency_key: str | None = None) -> int:
    return i


def ping_one(i: int) -> int:
    return ping(i)


@kx.agent(name="bench_dask_ping")
def ping_agent(run: kx.Run, n: int, concurrency: int, remote: bool) -> None:
    """``n`` items of one no-op effect each: what recording an item costs."""
    run.map(ping_one, range(n), concurrency=concurrency, executor=_executor(remote))
