"""Helpers for tests that start agents: unique names, waiting, and a teardown so that no
run outlives its test."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["finish_live_runs", "name", "stall_after_each_force", "thread_deaths", "wait_until"]


def thread_deaths(monkeypatch: Any) -> list[str]:
    """The threads that die of an exception from here on (``threading.excepthook``), each
    as "thread: exception"; empty while none did."""
    import threading

    died: list[str] = []
    monkeypatch.setattr(
        threading, "excepthook", lambda a: died.append(f"{a.thread}: {a.exc_value!r}")
    )
    return died


def stall_after_each_force(monkeypatch: Any, seconds: float = 0.5) -> None:
    """The engine's thread is held up for ``seconds`` after each stop it raises into a run
    or an item (as on a busy machine), before it records anything about it."""
    from kernelext._core.engine.forced_stop import ForceGate

    raise_now = ForceGate.try_raise

    def raise_then_stall(self: ForceGate, *, cut: bool = False) -> bool:
        raised = raise_now(self, cut=cut)
        if raised:
            time.sleep(seconds)
        return raised

    monkeypatch.setattr(ForceGate, "try_raise", raise_then_stall)


def finish_live_runs(wait: float = 60.0) -> None:
    """Stop every run still live in this process (its runtime) and wait for each to end."""
    from kernelext._core.process.runtime import runtime

    rt = runtime()
    with rt.live_lock:
        handles = list(rt.live_runs.values())
    for handle in handles:
        if handle.alive:
            handle.stop(source="test-teardown")
            handle.wait(wait)


def name(prefix: str) -> str:
    """A run or agent name unique to this test: ``prefix-<6 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_until(condition: Callable[[], bool], what: str, wait: float = 60.0) -> None:
    """Poll ``condition`` every 10 ms; fail saying ``what`` after ``wait`` seconds."""
    if not isinstance(what, str):  # a timeout passed where the words go
        raise TypeError(
            f"wait_until(condition, what, wait): what must say what is awaited, not {what!r}"
        )
    deadline = time.monotonic() + wait
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)
