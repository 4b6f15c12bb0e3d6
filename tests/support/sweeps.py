"""Expiry sweeps raced against each other: several ``kx.sweep()`` started at one moment."""

from __future__ import annotations

import threading
from typing import Any

WAIT = 60.0


def concurrent_sweeps(count: int = 3) -> list[Any]:
    """Run ``count`` sweeps in threads released together; the result of each."""
    import kernelext as kx

    barrier = threading.Barrier(count)
    results: list[Any] = []

    def sweeper() -> None:
        barrier.wait(WAIT)
        results.append(kx.sweep())

    threads = [threading.Thread(target=sweeper) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    return results
