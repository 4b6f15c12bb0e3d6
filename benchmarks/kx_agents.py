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
    "JOURNALED",
    "PAYLOADS",
    "bare_call",
    "effect_steps_agent",
    "effects_agent",
    "message",
    "messages_agent",
    "noop_agent",
    "paced_effects_agent",
    "paced_steps_agent",
    "payload_agent",
    "ping",
    "resume_agent",
    "resume_ping",
]

# Values the snapshot benchmark assigns to run.state, prepared outside the timing.
PAYLOADS: list[Any] = []
# Fold lag: perf_counter() at which record k (a step completion, an effect outcome) was
# journaled, filled by the paced agents below; index k is the k-th such record of the run.
JOURNALED: list[float] = []
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


@kx.agent(name="bench_effect_steps")
def effect_steps_agent(run: kx.Run, calls: int, per_step: int) -> None:
    """``calls`` effect calls, ``per_step`` to a step; MARKS gets a timestamp after each."""
    for s in run.steps(range(calls // per_step)):
        for j in range(per_step):
            ping(s * per_step + j)
            MARKS.append(time.perf_counter())


def _pace(start: float, k: int, rate: float) -> None:
    """Sleep until record ``k`` is due at ``rate`` per second after ``start``.

    The schedule is absolute (open loop): after a stall the agent runs back to back until
    it is on schedule again, as a load generator does.
    """
    delay = start + k / rate - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


@kx.agent(name="bench_paced_steps")
def paced_steps_agent(run: kx.Run, n: int, rate: float, seconds: float) -> None:
    """Up to ``n`` no-op steps at ``rate`` steps/s, for at most ``seconds``.

    JOURNALED[k] = when step k's completion was journaled: the next body starts right after
    ``complete_step`` returned. A step cut off by ``seconds`` is completed by the engine
    after the agent returns, without an entry.
    """
    start = 0.0
    for i in run.steps(range(n)):
        now = time.perf_counter()
        if i:
            JOURNALED.append(now)
        else:
            start = now
        if now - start >= seconds:
            break
        run.state["i"] = i
        _pace(start, i + 1, rate)
    else:
        JOURNALED.append(time.perf_counter())


@kx.agent(name="bench_paced_effects")
def paced_effects_agent(
    run: kx.Run, calls: int, rate: float, per_step: int, seconds: float
) -> None:
    """Up to ``calls`` effect calls at ``rate`` calls/s, ``per_step`` to a step, ending at the
    first step end after ``seconds``. JOURNALED[k] = when call k returned, i.e. right after
    its ``applied`` outcome was journaled."""
    start = time.perf_counter()
    for s in run.steps(range(calls // per_step)):
        for j in range(per_step):
            k = s * per_step + j
            _pace(start, k, rate)
            ping(k)
            JOURNALED.append(time.perf_counter())
        if time.perf_counter() - start >= seconds:
            break
