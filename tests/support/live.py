"""Teardown for tests that start agents: no run outlives its test."""

from __future__ import annotations

__all__ = ["finish_live_runs"]


def finish_live_runs(wait: float = 60.0) -> None:
    """Stop every run still live in this process and wait for each to end."""
    from kernelext.core.registry import LIVE, LIVE_LOCK

    with LIVE_LOCK:
        handles = list(LIVE.values())
    for handle in handles:
        if handle.alive:
            handle.stop(source="test-teardown")
            handle.wait(wait)
