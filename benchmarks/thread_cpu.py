"""Where the CPU of a workload goes, per thread, with nothing profiled (Linux).

A sampler thread reads every thread's CPU time (user + system, ``/proc/self/task/*/stat``)
every 20 ms and keeps the last reading of each; threads are grouped by name (a pool's
``name_0``, ``name_1`` … together, the run id left out). What a thread spent in its last
20 ms before it ended is missed. ``python -m benchmarks profile batch`` prints it before
its profiled run, whose figures cProfile inflates.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections import Counter
from collections.abc import Iterator

__all__ = ["thread_cpu"]

TICK_S = 0.02


def _read(ticks: int, names: dict[int, str], seen: dict[int, tuple[str, float]]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        native = int(tid)
        name = names.get(native) or seen.get(native, ("(not Python)", 0.0))[0]
        seen[native] = (name, (int(fields[11]) + int(fields[12])) / ticks)


def _group(name: str) -> str:
    return re.sub(r"_\d+$", "_*", re.sub(r"\[.*?\]", "", name))


@contextlib.contextmanager
def thread_cpu() -> Iterator[Counter[str]]:
    """``with thread_cpu() as cpu: ...``: afterwards ``cpu`` holds CPU seconds per thread
    group spent inside the block (empty where ``/proc`` is not there)."""
    out: Counter[str] = Counter()
    if not os.path.isdir("/proc/self/task"):
        yield out
        return
    ticks = os.sysconf("SC_CLK_TCK")
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def snapshot() -> None:
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
        _read(ticks, names, seen)

    snapshot()
    base = {tid: cpu for tid, (_, cpu) in seen.items()}

    def sample() -> None:
        while not done.wait(TICK_S):
            snapshot()

    sampler = threading.Thread(target=sample, name="bench-cpu-sampler", daemon=True)
    sampler.start()
    try:
        yield out
    finally:
        done.set()
        sampler.join()
        snapshot()
        for tid, (name, cpu) in seen.items():
            if name != "bench-cpu-sampler":
                out[_group(name)] += cpu - base.get(tid, 0.0)
