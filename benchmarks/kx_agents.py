"""The kernelext agents and effects the benchmarks run.

They live in a module of their own so that a child process (the resume benchmark)
defines exactly the same code, hence the same agent fingerprint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kernelext as kx

from .common import MARKS

__all__ = [
    "PAYLOADS",
    "bare_call",
    "effects_agent",
    "message",
    "messages_agent",
    "noop_agent",
    "payload_agent",
    "ping",
    "resume_agent",
    "resume_ping",
]

# Values the snapshot benchmark assigns to run.state, prepared outside the timing.
PAYLOADS: list[Any] = []
# Set by the resume child: called by the first effect body that really runs.
ON_ACTION: list[Callable[[int, int], None]] = []


def message(i: int) -> dict[str, str]:
    """One chat message of about 200 bytes, the same for every system."""
    return {
        "role": "assistant" if i % 2 else "user",
        "content": f"message {i}: " + "the quick brown fox jumps over the lazy dog; " * 3,
    }


def bare_call(i: int) -> dict[str, Any]:
    """The 'external call' itself: trivial, so that only the recording cost remains."""
    return {"ok": True, "i": i}


@kx.effect
def ping(i: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    return bare_call(i)


@kx.effect
def resume_ping(i: int, j: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    for hook in ON_ACTION:
        hook(i, j)
    return bare_call(j)


@kx.agent(name="bench_noop")
def noop_agent(run: kx.Run, n: int) -> None:
    for i in run.steps(range(n)):
        MARKS.append(time.perf_counter())
        run.state["i"] = i


@kx.agent(name="bench_payload")
def payload_agent(run: kx.Run, n: int) -> None:
    for i in run.steps(range(n)):
        MARKS.append(time.perf_counter())
        run.state["payload"] = PAYLOADS[i % len(PAYLOADS)]


@kx.agent(name="bench_messages")
def messages_agent(run: kx.Run, n: int) -> None:
    for i in run.steps(range(n)):
        run.state.setdefault("messages", []).append(message(i))


@kx.agent(name="bench_effects")
def effects_agent(run: kx.Run, calls: int, spacing_s: float) -> None:
    """Effect calls in one step; MARKS gets the wall time of each call."""
    with run.step("calls"):
        for i in range(calls):
            if spacing_s:
                time.sleep(spacing_s)  # other agent work between calls, not timed
            start = time.perf_counter()
            ping(i)
            MARKS.append(time.perf_counter() - start)


@kx.agent(name="bench_resume")
def resume_agent(run: kx.Run, n_steps: int, calls_per_step: int, pause_after: int) -> None:
    """Suspends itself once, after step ``pause_after``; a resume goes on from there."""
    for i in run.steps(range(n_steps)):
        for j in range(calls_per_step):
            resume_ping(i, j)
        run.state["done"] = i
        if i == pause_after and not run.state.get("paused"):
            run.state["paused"] = True
            run.suspend("user_stop")
