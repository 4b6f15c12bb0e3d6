"""The kernelext agents and effects of the batch benchmark (``benchmarks.batch``).

In a module of their own so that the resume child process defines exactly the same code,
hence the same agent fingerprint.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import kernelext as kx

__all__ = [
    "ITEM_TIMES",
    "ON_ITEM",
    "STOP_AT",
    "big_agent",
    "nap_agent",
    "ping_agent",
    "post_agent",
]

# Stop benchmark: item index -> [perf_counter() at the start of its body, at its end].
ITEM_TIMES: dict[int, list[float]] = {}
# Resume child: called with the item's index when an item body starts.
ON_ITEM: list[Callable[[int], None]] = []
# Build child of the 100,000-item map: the item whose start stops the run (drain).
STOP_AT: list[int] = []


@kx.effect
def post_item(i: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    from .batch_http import post

    return post(i, idempotency_key)


def _post_one(i: int) -> bool:
    return bool(post_item(i)["ok"])


@kx.agent(name="bench_batch_post")
def post_agent(run: kx.Run, n: int, concurrency: int) -> None:
    """``n`` items, one POST each (a recorded effect), ``concurrency`` at a time."""
    run.map(_post_one, range(n), concurrency=concurrency)


@kx.effect
def batch_ping(i: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    return {"ok": True, "i": i}


def _ping_one(i: int) -> int:
    return int(batch_ping(i)["i"])


@kx.agent(name="bench_batch_ping")
def ping_agent(run: kx.Run, n: int, concurrency: int) -> None:
    """``n`` items of one zero-latency effect each."""
    run.map(_ping_one, range(n), concurrency=concurrency)


@kx.effect
def nap(i: int, seconds: float, *, idempotency_key: str | None = None) -> int:
    time.sleep(seconds)
    return i


def nap_seconds(i: int) -> float:
    """Item ``i``'s duration: 20 to 300 ms, spread evenly and the same in every run."""
    return 0.02 + ((i * 7919) % 29) / 28 * 0.28


def _nap_one(i: int) -> int:
    times = ITEM_TIMES.setdefault(i, [time.perf_counter()])
    nap(i, nap_seconds(i))
    times.append(time.perf_counter())
    return i


@kx.agent(name="bench_batch_nap")
def nap_agent(run: kx.Run, n: int, concurrency: int) -> None:
    """``n`` items of 20 to 300 ms each (one effect that sleeps)."""
    run.map(_nap_one, range(n), concurrency=concurrency)


def _big_one(run_id: str, i: int) -> int:
    for hook in ON_ITEM:
        hook(i)
    batch_ping(i)
    if STOP_AT and i == STOP_AT[0]:
        kx.stop(run_id, source="bench")  # the items in flight drain, then it suspends
    return i


@kx.agent(name="bench_batch_big")
def big_agent(run: kx.Run, n: int, concurrency: int) -> None:
    """The 100,000-item map: zero-latency items, one effect each."""
    values = run.map(functools.partial(_big_one, run.id), range(n), concurrency=concurrency)
    run.state["n"] = len(values)
